"""The matching core of the DETR trainer integrations (the peer's RT-DETR, transformers' DETR family): everything but
the trainer's own cost.

A DETR loss matches each decoder layer's queries against the images' objects, one matcher call per layer, each call
solving one problem per image (and query group) with SciPy. Here:

- ``Layout``: a call's ragged problems (the objects per image, the queries in groups), computed on the host from the
  object counts and copied to the device in one transfer; it pads objects into per-image blocks and turns the op's
  solved columns into the trainer's matches.
- ``solve``/``matches``: every problem of a call (or of every layer of a loss call) in one call of the op, through the
  one dispatch (lucid_assign.dispatch), and the trainer's index format.
- ``layered``: the layers of one loss call at once. A call whose inputs are one layer each of the decoder's stacked
  outputs (``layer_of``) computes every layer's cost at its first call (the trainer's ``costs`` of the stacked views,
  per image block) and solves them together; the later calls of that loss take their layer's matches while they are
  the same call (one rule, ``Memo``), each layer once.
- ``cost_at_cpu``: the cost a trainer's own matcher copies to the host, taken there (``TensorHook``: a tensor
  method's calls in one thread, handed to a handler).
- ``runs_here``: whether the kernel runs for a call, or the trainer's own matcher (said once).

A trainer integration supplies its cost per image block (problems of shape (layers * images * groups, queries per
group, most objects)) and its patch; the core does the rest.
"""

from __future__ import annotations

import contextlib
import functools
import operator
import threading
import weakref
from typing import Callable, NamedTuple, Sequence

import numpy as np
import torch

from .. import _library, dispatch, matching

MAX_LAYERS = 16  # the most layers a stack may have to be matched at once


# --- the ragged problems of one call ------------------------------------------------------------------------------


class Layout(NamedTuple):
    """Where each object and each match of one call goes: image b's group g is problem b * groups + g, its objects
    the problem's first columns (``width`` in all: the most objects of an image, at least 1)."""

    counts: tuple  # objects per image
    queries: int  # the call's queries (all groups)
    groups: int
    width: int
    sizes: torch.Tensor  # (images * groups,) the objects of each problem (the op's sizes)
    object_image: torch.Tensor  # (N,) the image of each of the batch's objects, image after image
    object_slot: torch.Tensor  # (N,) its column in its image's problems
    columns: torch.Tensor  # (images, width) each slot's column in a cross-product cost (padding: the image's last)
    pairs: torch.Tensor  # each image's matches' places in the op's (problems, K) outputs, image after image
    query_offset: torch.Tensor  # per match: the first query of its group
    object_offset: torch.Tensor  # per match: its image's first object among the batch's
    per_image: tuple  # matches per image (all groups)
    image_sizes: torch.Tensor  # (images,) the objects of each image


def layout(counts: Sequence[int], queries: int, groups: int, device) -> Layout:
    """The Layout of a call with ``counts[b]`` objects in image b and ``queries`` queries in ``groups`` groups. The
    last few are kept (read-only tensors): the matcher calls of one training step share one, and its transfer."""
    return _layout(tuple(int(n) for n in counts), int(queries), int(groups), torch.device(device))


@functools.lru_cache(maxsize=8)
def _layout(counts: tuple, queries: int, groups: int, device: torch.device) -> Layout:
    n = np.asarray(counts, dtype=np.int64).reshape(-1)
    images, per_group = len(counts), queries // groups
    width = max(int(n.max()) if images else 0, 1)
    starts = np.cumsum(n) - n
    total = int(n.sum())
    object_image = np.repeat(np.arange(images), n)
    object_slot = np.arange(total) - starts[object_image]
    slots = np.minimum(np.arange(width)[None], np.maximum(n - 1, 0)[:, None])
    columns = np.minimum(starts[:, None] + slots, max(total - 1, 0))
    k = np.minimum(n, per_group)
    per_problem = np.repeat(k, groups)  # problem b * groups + g: its k[b] matches come first in its row of the outputs
    first = np.repeat(np.arange(images * groups) * min(per_group, width), per_problem)
    rank = np.arange(int(per_problem.sum())) - np.repeat(np.cumsum(per_problem) - per_problem, per_problem)
    query_offset = np.repeat(np.tile(np.arange(groups) * per_group, images), per_problem)
    object_offset = np.repeat(np.repeat(starts, groups), per_problem)
    parts = (np.repeat(n, groups), object_image, object_slot, columns.reshape(-1), first + rank, query_offset,
             object_offset, n)
    packed = torch.from_numpy(np.concatenate(parts).astype(np.int64)).to(device, non_blocking=True)
    sizes, object_image, object_slot, columns, pairs, query_offset, object_offset, image_sizes = packed.split(
        [len(p) for p in parts])
    return Layout(counts, queries, groups, width, sizes, object_image, object_slot, columns.view(images, width), pairs,
                  query_offset, object_offset, tuple((k * groups).tolist()), image_sizes)


def count(v) -> int:
    """``len(v)``: an image's objects, from a tensor's first dimension without Tensor.__len__'s Python call."""
    return v.shape[0] if type(v) is torch.Tensor and v.dim() > 0 else len(v)


def pad_objects(flat: torch.Tensor, where: Layout) -> torch.Tensor:
    """The batch's objects (N, ...), image after image, as per-image blocks (images, most objects, ...), zeros after
    each image's objects: ``pad_sequence(flat.split(counts), batch_first=True)`` as one scatter."""
    out = flat.new_zeros((len(where.counts), max(where.counts), *flat.shape[1:]))
    return out.index_put_((where.object_image, where.object_slot), flat)


def problems_of_cross_cost(cost: torch.Tensor, where: Layout) -> torch.Tensor:
    """The problems of a (images, queries, all objects of the batch) cost: (images * groups, queries per group,
    width), each image's objects first (a gather: exact), its queries in groups."""
    bs, nq, _ = cost.shape
    per_group = nq // where.groups
    padded = cost.gather(2, where.columns[:, None, :].expand(bs, nq, where.width))
    return padded[:, : per_group * where.groups].reshape(bs * where.groups, per_group, where.width)


# --- the solve and the trainer's matches --------------------------------------------------------------------------


def solve(problems: torch.Tensor, where: Layout, backend: str, layers: int = 1):
    """The op's (rows, cols, info) of ``layers`` layers' problems (each as ``where`` lays them out), in one call;
    ``backend`` as runs_here() chose it ("kernel" or "reference")."""
    return matching.run(backend, problems, _sizes(where, layers))


_REPEATED: dict = {}  # (id of a Layout, layers) -> (the Layout, its sizes for that many layers), the Layout kept alive


def _sizes(where: Layout, layers: int) -> torch.Tensor:
    """The op's sizes of ``layers`` layers' problems laid out by ``where``, made once per Layout and count (read-only,
    as the Layout's tensors are): a loss call's solve dispatches no operation for them."""
    if layers == 1:
        return where.sizes
    found = _REPEATED.get((id(where), layers))
    if found is None or found[0] is not where:
        if len(_REPEATED) >= 16:
            _REPEATED.clear()
        found = _REPEATED[(id(where), layers)] = (where, where.sizes.repeat(layers))
    return found[1]


# The devices on which the matches are picked by torch.ops.lucid.matches (ATen's operations in C++, one call from
# Python) rather than by the same operations from Python here: those a run has checked.
MATCHES_OP_DEVICES = ("cpu", "cuda")


def matches(rows: torch.Tensor, cols: torch.Tensor, where: Layout, layers: int = 1, batch_objects: bool = False):
    """Each image's matches from the op's (layers * problems, K) outputs: (queries ascending, their objects), int64
    on the device, image after image, layer after layer; the objects indexed in their image, or among the batch's
    (``batch_objects``, the peer's form)."""
    split = where.per_image * layers
    if rows.device.type in MATCHES_OP_DEVICES and _library.loaded():  # one implementation, every backend
        queries, objects = torch.ops.lucid.matches(rows, cols, where.pairs,
                                                   where.query_offset if where.groups > 1 else None,
                                                   where.object_offset if batch_objects else None, layers)
        return _per_image(queries, objects, split)
    queries = rows.reshape(layers, -1).index_select(1, where.pairs)
    if where.groups > 1:
        queries.add_(where.query_offset)
    objects = cols.reshape(layers, -1).index_select(1, where.pairs)
    if batch_objects:
        objects.add_(where.object_offset)
    return _per_image(queries.view(-1), objects.view(-1), split)


def _per_image(queries: torch.Tensor, objects: torch.Tensor, split: tuple) -> list:
    """(queries, objects) of each image: pieces of the flat results, which nothing else holds. Pieces that do not
    overlap need no view tracking (unsafe_split_with_sizes: a fifth less host time than split_with_sizes)."""
    return list(zip(queries.unsafe_split_with_sizes(split), objects.unsafe_split_with_sizes(split)))


def no_matches(where: Layout, device) -> list:
    """Each image's matches when the batch has no objects: empty int64 tensors."""
    empty = torch.zeros(0, dtype=torch.int64, device=device)
    return [(empty, empty) for _ in where.counts]


def raise_refused(info: torch.Tensor | list, where: Layout) -> None:
    """SciPy's ValueError for the first problem of one call's ``info`` that SciPy's loop would refuse (its loop over
    query groups outside its loop over images), naming the image (and group). Reads a tensor ``info`` (one
    synchronisation); ``info`` may also be its values, read already (a list)."""
    images, groups = len(where.counts), where.groups
    order = [b * groups + g for g in range(groups) for b in range(images)]

    def name(p: int) -> str:
        return f"image {p // groups}" + (f", query group {p % groups}" if groups > 1 else "")

    matching.raise_unsolved(info if isinstance(info, list) else info.reshape(-1), name, order)


class Guarded(NamedTuple):
    """A trainer's problems with a flag on the device, True where the call must run the trainer's own code instead
    (inputs the trainer refuses, whose error its own code raises): read after the solve, together with the solve's
    status where that is checked, in one synchronisation."""

    problems: torch.Tensor
    declined: torch.Tensor  # one element, nonzero where declined


def settle(declined: torch.Tensor | None, info: torch.Tensor, check: bool) -> tuple:
    """(whether the call is declined, the solve's status codes on the host where ``check``, else None): one read of
    the device (none where there is nothing to read)."""
    if declined is None:
        return False, (info.cpu().tolist() if check else None)
    if not check:
        return bool(declined), None
    flags = torch.cat([declined.reshape(1), info]).cpu().tolist()  # the bool promoted to the status's dtype
    return bool(flags[0]), flags[1:]


def solve_call(problems, where: Layout, backend: str, check: bool, batch_objects: bool = False):
    """One call's matches of its problems (a tensor, or Guarded: None where declined; None: the batch has no
    objects); ``check``: SciPy's error where a problem holds NaN or -inf or is infeasible."""
    if problems is None:
        return no_matches(where, where.sizes.device)
    problems, declined = problems if isinstance(problems, Guarded) else (problems, None)
    rows, cols, info = solve(problems, where, backend)
    found = matches(rows, cols, where, batch_objects=batch_objects)
    refused, codes = settle(declined, info, check)
    if refused:
        return None
    if check:
        raise_refused(codes, where)
    return found


# --- where the kernel runs ----------------------------------------------------------------------------------------


def runs_here(state, backend: str, device: str, what: str) -> str | None:
    """The backend a patched matcher's call on ``device`` runs under ``backend`` ("kernel" or "reference"), or None
    where the kernel cannot run and the backend is "auto": the trainer's own matcher then, said once through
    ``state`` (the integration's PatchState); "kernel" raises."""
    def own(why):
        state.say_once(f"lucid-assign: the patched {what} cannot run its kernel here ({why}), so these calls go to "
                       f"{state.trainer}'s own matcher, at its speed. Fix: {dispatch.kernel_fix(device, why)}")
        return None

    return dispatch.choice(backend, ("linear_sum_assignment", device), own)


# --- the cost a trainer's matcher copies to the host ----------------------------------------------------------------


class TensorHook:
    """One method of ``torch.Tensor`` (``cpu``, ``split``), replaced while some thread runs a ``handled`` block for it:
    in that thread the block's handler takes its calls, ``handler(tensor, args, kwargs)``; every other call, in any
    thread, is torch's own (``own``). One Python call on each call of the method while it is replaced, where a torch
    function mode would intercept every tensor operation."""

    def __init__(self, name: str):
        self.name = name
        self._local = threading.local()  # .handler: this thread's, or None
        self._lock = threading.Lock()
        self._users = 0  # handled blocks in flight (all threads)
        self._saved = None  # what torch.Tensor itself defined under the name before (None: inherited from TensorBase)
        hook = self

        def method(tensor, *args, **kwargs):
            handler = getattr(hook._local, "handler", None)
            return hook.own(tensor, *args, **kwargs) if handler is None else handler(tensor, args, kwargs)

        self._method = method

    def own(self, tensor, *args, **kwargs):
        """torch's own method (what torch.Tensor had before the hook)."""
        saved = self._saved
        return (getattr(torch._C.TensorBase, self.name) if saved is None else saved)(tensor, *args, **kwargs)

    @contextlib.contextmanager
    def handled(self, handler: Callable):
        """The block's calls of the method in this thread go to ``handler`` (a nested block's to its own)."""
        with self._lock:
            if self._users == 0:
                self._saved = vars(torch.Tensor).get(self.name)
                setattr(torch.Tensor, self.name, self._method)
            self._users += 1
        before = getattr(self._local, "handler", None)
        self._local.handler = handler
        try:
            yield
        finally:
            self._local.handler = before
            with self._lock:
                self._users -= 1
                if self._users == 0:
                    if self._saved is None:
                        delattr(torch.Tensor, self.name)
                    else:
                        setattr(torch.Tensor, self.name, self._saved)
                    self._saved = None


HOST_COPY = TensorHook("cpu")  # a matcher's copy of its cost to the host, ``.cpu()``


class CostTaken(Exception):
    """Raised out of a trainer's matcher at its copy of the cost to the host, carrying the cost."""

    def __init__(self, cost: torch.Tensor):
        super().__init__("the matcher's cost")
        self.cost = cost


@contextlib.contextmanager
def cost_at_cpu(stop: bool = True):
    """In this thread, the 3-D tensors copied to the host in the block: with ``stop``, the first stops the block
    (CostTaken, carrying it) and the later copies are torch's own; else each is captured (a copy, in the list this
    yields) and copied as usual."""
    costs: list = []
    taken = []

    def handler(tensor, args, kwargs):
        if tensor.dim() == 3 and not taken:
            if stop:
                taken.append(tensor)
                raise CostTaken(tensor)
            costs.append(tensor.detach().clone())
        return HOST_COPY.own(tensor, *args, **kwargs)

    with HOST_COPY.handled(handler):
        yield costs


# --- the layers of one loss call matched at once --------------------------------------------------------------------


class Layer(NamedTuple):
    """Where a tensor sits in a stack of layers."""

    stack: torch.Tensor  # the tensor whose elements hold every layer (the view's base)
    step: int  # elements from one layer to the next
    layer: int  # the view's layer
    layers: int
    where: int  # the view's first element in its layer


def layer_of(t) -> Layer | None:
    """Where ``t`` sits in the stacked outputs of a decoder's layers, or None. Two shapes of stack: ``t`` is
    ``stack.select(dim, layer)`` sliced along the other dims (indexing or iterating an (L, B, Q, C) stack, or a
    (B, L, Q, C) one), or a contiguous block of a contiguous stack (a head's output over the flattened layers, viewed
    as (L, B, Q, C)); 2 to MAX_LAYERS layers. Any view of the same storage with the same geometry is served the same
    cost, so a stack that is not a decoder's costs work, never a wrong match."""
    if type(t) is not torch.Tensor or type(t._base) is not torch.Tensor:  # a subclass (a trace's fake tensor, say)
        return None
    stack = t._base
    if stack.dtype != t.dtype or not stack.is_contiguous() or t.numel() == 0:
        return None
    offset = t.storage_offset() - stack.storage_offset()
    shape, strides, t_shape, t_strides = tuple(stack.shape), stack.stride(), tuple(t.shape), t.stride()
    if shape[1:] == t_shape and 1 < shape[0] <= MAX_LAYERS and strides[1:] == t_strides and offset % strides[0] == 0:
        return Layer(stack, strides[0], offset // strides[0], shape[0], 0)  # stack[l]: the common case
    if len(shape) == len(t_shape) + 1 and min(strides) > 0:
        index = [(offset // stride) % size for size, stride in zip(shape, strides)]
        if sum(i * stride for i, stride in zip(index, strides)) == offset:
            for dim in range(len(shape)):
                if (1 < shape[dim] <= MAX_LAYERS and strides[:dim] + strides[dim + 1:] == t_strides
                        and all(i + n <= size for i, n, size in
                                zip(index[:dim] + index[dim + 1:], t_shape, shape[:dim] + shape[dim + 1:]))):
                    return Layer(stack, strides[dim], index[dim], shape[dim], offset - index[dim] * strides[dim])
    step = t.numel()
    layers, rest = divmod(stack.numel(), step)
    if t.is_contiguous() and offset % step == 0 and rest == 0 and 1 < layers <= MAX_LAYERS:
        return Layer(stack, step, offset // step, layers, 0)
    return None


def stacked(t: torch.Tensor, found: Layer, first: int = 0, layers: int | None = None) -> torch.Tensor:
    """Every layer's view of the stack, as ``t`` is its layer's: (layers, *t.shape); or ``layers`` of them from layer
    ``first`` on."""
    layers = found.layers - first if layers is None else layers
    return found.stack.as_strided((layers, *t.shape), (found.step, *t.stride()),
                                  t.storage_offset() + (first - found.layer) * found.step)


_UNKEYED = object()  # a value settings_of leaves out
_SCALARS = frozenset((bool, int, float, str, type(None)))


def settings_of(m) -> tuple:
    """A matcher's settings: its public attributes whose values are numbers, strings or None, or tuples, lists or
    dicts of such values (in the matcher's own order)."""
    found = []
    for k, v in vars(m).items():
        if k[0] == "_":
            continue
        if type(v) not in _SCALARS:
            v = _plain(v)
            if v is _UNKEYED:
                continue
        found.append((k, v))
    return tuple(found)


def _plain(v):
    if isinstance(v, (bool, int, float, str, type(None))):
        return v
    if isinstance(v, (tuple, list)):
        items = tuple(_plain(x) for x in v)
        return _UNKEYED if _UNKEYED in items else items
    if isinstance(v, dict):
        items = tuple((k, _plain(x)) for k, x in v.items())
        return _UNKEYED if any(x is _UNKEYED or not isinstance(k, str) for k, x in items) else items
    return _UNKEYED


class Memo:
    """Every layer's matches of one stack against one batch of objects, each handed out once. It keeps weak
    references to the stacks (its Solve to the objects; never the autograd graph alive) and serves a later call only
    while they are the same tensors, unchanged (their version counters), in the same geometry, with the same layout
    and the matcher's same settings and autocast region: the one rule of "same call". Its tickets serve the calls
    whose inputs the loss call in progress named (loss_call) by the same rule, told without looking for their stacks:
    the same input tensors, in the same geometry, on the same stacks."""

    def __init__(self, stacks: list, key: tuple, layers: dict, info: tuple, where: Layout, codes: dict | None,
                 tickets: dict):
        self._stacks, self._key = stacks, key  # weak references; the key (_keyed's)
        self._layers, self._info, self._where = layers, info, where  # layers: layer -> its matches; info: (the
        # solve's status, where the stack's layer 0 would sit among the solve's layers, the solve's layers)
        self._codes = codes  # layer -> info read to the host, where it was read at the stack's first call
        self.tickets = tickets  # id of a call's first input -> (its inputs (weak), their geometry, its layer)

    @property
    def key_rest(self) -> tuple:
        """What its calls share in the key besides the stacks (_call_key's)."""
        return self._key[2]

    def take(self, stacks: list, key: tuple, layer: int, check: bool):
        """This call's matches (its objects the solve's: _memos_of) where its stacks and key are the memo's, else
        None."""
        if (layer not in self._layers or key != self._key or len(stacks) != len(self._stacks)
                or any(ref() is not t for ref, t in zip(self._stacks, stacks))):
            return None
        return self._hand(layer, check)

    def take_ticket(self, inputs: Sequence[torch.Tensor], rest: tuple, check: bool):
        """The matches of a call (its objects the solve's) whose inputs this memo holds a ticket for, by the rule of
        take(), else None. ``rest``: _call_key's."""
        ticket = self.tickets.get(id(inputs[0]))
        if ticket is None:
            return None
        refs, geometry, layer = ticket
        if (layer not in self._layers or rest != self._key[2] or len(inputs) != len(refs)
                or any(ref() is not t for ref, t in zip(refs, inputs))
                or _geometry(inputs, self._stacks) != geometry
                or tuple(t._version for t in inputs) != self._key[1]):
            return None
        return self._hand(layer, check)

    def _hand(self, layer: int, check: bool):
        if check:
            if self._codes is None:
                info, zero, layers = self._info  # the solve's status of every part's layers
                codes = info.view(layers, -1)[zero + layer]
            else:
                codes = self._codes[layer]
            raise_refused(codes, self._where)
        return self._layers.pop(layer)


def _geometry(inputs: Sequence[torch.Tensor], stacks: list) -> tuple | None:
    """Each input's shape, strides and place in its stack (``stacks``: weak references to them, input by input), or
    None where an input is not a view of its stack (nor the stack)."""
    found = []
    for t, ref in zip(inputs, stacks):
        stack = ref()
        if stack is not t and t._base is not stack:
            return None
        found.append((tuple(t.shape), t.stride(), t.storage_offset()))
    return tuple(found)


_VERSION = operator.attrgetter("_version")
_SHAPE = operator.attrgetter("shape")
_DEREF = weakref.ref.__call__


class Solve(NamedTuple):
    """A matcher's last solve: its objects (weak references, versions and shapes: _seen), what the trainer's
    integration tells its calls' objects by besides (``tag``: the targets' keys, say) and its Memos (a stack's
    each)."""

    refs: tuple
    versions: list
    shapes: list
    tag: object
    memos: list

    def holds(self, objects: Sequence[torch.Tensor], shapes: bool = False) -> bool:
        """Whether ``objects`` are the solve's, unchanged (the same tensors, the same versions; with ``shapes``, the
        same shapes too): one pass of each test in C (an earlier batch's solve fails at its first object)."""
        return (len(objects) == len(self.refs) and all(map(operator.is_, map(_DEREF, self.refs), objects))
                and list(map(_VERSION, objects)) == self.versions
                and (not shapes or list(map(_SHAPE, objects)) == self.shapes))


_MEMOS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # matcher -> its last Solve, kept outside the matcher
# (which trainers deep-copy and save with the model)


def _memos_of(m, objects: Sequence[torch.Tensor]) -> list:
    """The memos of the matcher's last solve where ``objects`` are its objects, unchanged (the first test of the rule),
    else []."""
    solve_ = _MEMOS.get(m)
    return solve_.memos if solve_ is not None and solve_.holds(objects) else []


def _seen(objects: Sequence[torch.Tensor]) -> tuple | None:
    """The objects as a solve holds them: (weak references, versions, shapes); None where an object tracks no version
    (an inference tensor: the call cannot be keyed)."""
    try:
        return tuple(map(weakref.ref, objects)), list(map(_VERSION, objects)), list(map(_SHAPE, objects))
    except RuntimeError:
        return None


def _region(device: str) -> tuple:
    """The autocast region of a device type, as keys hold it."""
    return (torch.is_autocast_enabled(device), torch.get_autocast_dtype(device)) if device in ("cpu", "cuda") else ()


def _call_key(m, where: Layout, backend: str, device: str) -> tuple:
    """What every input of a call shares in its key besides its objects: the layout, the matcher's settings, the
    backend and the autocast region of the inputs' device."""
    return where.counts, where.queries, where.groups, settings_of(m), backend, _region(device)


def _keyed(m, inputs: Sequence[torch.Tensor], where: Layout, backend: str, alone: bool = False,
           rest: tuple | None = None):
    """(where each input sits in its stack, the stacks, the key: the geometry, the stacks' versions and _call_key's),
    or None where the inputs are not the same layer of stacks or the call cannot be keyed (inference tensors track
    no versions). ``alone``: inputs that are not the same layer of stacks are each a stack of one layer (a loss
    call's output of its own, see loss_call). ``rest``: _call_key's, where the caller has it."""
    found = [layer_of(t) for t in inputs]
    if any(f is None for f in found) or len({(f.layer, f.layers) for f in found}) != 1:
        if not alone:
            return None
        found = [Layer(t, max(t.numel(), 1), 0, 1, 0) for t in inputs]
    stacks = [f.stack for f in found]
    try:
        versions = tuple(t._version for t in stacks)
    except RuntimeError:  # an inference tensor
        return None
    if rest is None:
        rest = _call_key(m, where, backend, inputs[0].device.type)
    geometry = tuple((f.step, f.layers, f.where, tuple(t.shape), t.stride()) for f, t in zip(found, inputs))
    return found, stacks, (geometry, versions, rest)


def _take(memos: list, keyed, check: bool):
    """A memo's matches for this call (the first of ``memos``, those holding its objects, that serves it), or
    None."""
    found, stacks, key = keyed
    for memo in memos:
        served = memo.take(stacks, key, found[0].layer, check)
        if served is not None:
            return served
    return None


def served(m, inputs: Sequence[torch.Tensor], objects: Sequence[torch.Tensor], where: Layout, backend: str,
           check: bool):
    """This call's matches where an earlier call on the same stacks (layered) solved them and the memo serves the
    same call, else None: what layered() would serve, without its cost function."""
    memos = _memos_of(m, objects)
    if not memos:
        return None
    rest = _call_key(m, where, backend, inputs[0].device.type)
    for memo in memos:  # a call the loss named: its ticket
        found = memo.take_ticket(inputs, rest, check)
        if found is not None:
            return found
    keyed = _keyed(m, inputs, where, backend, alone=bool(_loss_inputs(m)), rest=rest)
    return None if keyed is None else _take(memos, keyed, check)


def served_again(m, inputs: Sequence[torch.Tensor], objects: Sequence[torch.Tensor], tag, groups: int, backend: str,
                 check: bool):
    """The matches of a call that the loss call in progress named (its ticket, see served) where the matcher's last
    solve holds its objects unchanged, of the same shapes, with the same ``tag``, else None: served() told without
    the call's Layout, which the same objects give (its objects' counts), the inputs' shapes (its queries) and
    ``groups``."""
    solve_ = _MEMOS.get(m)
    if solve_ is None or solve_.tag != tag or not solve_.holds(objects, shapes=True):
        return None
    first = id(inputs[0])
    for memo in solve_.memos:
        if first in memo.tickets:
            rest = memo.key_rest
            if (rest[2] != groups or rest[4] != backend or rest[5] != _region(inputs[0].device.type)
                    or rest[3] != settings_of(m)):
                return None
            return memo.take_ticket(inputs, rest, check)
    return None


# --- every matcher call of one loss call at once --------------------------------------------------------------------
# A loss calls its matcher on outputs that are not all layers of one stack (RT-DETR's encoder proposals, DETR's and
# LW-DETR's last layer, LW-DETR's encoder outputs). While a patched loss's forward runs (loss_call), the inputs of
# each call it will make are known: the first call solves them all with its own, each stack (or output of its own)
# a block of layers of one cost and one solve, and the later calls take theirs from the memos (the same rule of
# "same call").

_LOSS = threading.local()  # .open: [(matcher, [inputs of each call the loss will make])], innermost last


@contextlib.contextmanager
def loss_call(m, calls: Sequence[Sequence[torch.Tensor]]):
    """While a loss's forward runs: ``calls``, the inputs (as layered() takes them) of the calls it will make of its
    matcher ``m``."""
    open_calls = _LOSS.__dict__.setdefault("open", [])
    open_calls.append((m, [tuple(c) for c in calls]))
    try:
        yield
    finally:
        open_calls.pop()


def _loss_inputs(m) -> list:
    """The inputs of the calls of ``m`` that the innermost loss call in progress will make ([] outside one)."""
    for matcher, calls in reversed(getattr(_LOSS, "open", ())):
        if matcher is m:
            return calls
    return []


def _parts(m, inputs, keyed, where: Layout, backend: str, unstacked: bool = False) -> tuple:
    """(the stacks solved with this call's: its own, then those of the loss call's other calls (each once) whose
    layers have its layers' shapes and devices, each as (its key, its inputs, its stacked views, the first layer of
    the views, their layers); the tickets of the loss call's other calls: (part, layer, inputs)). Inside a loss call
    (loss_call) a stack's views hold the layers from the first to the last that its calls name (a decoder's stack may
    hold a layer that no call matches); else every layer. ``unstacked``: a part of one layer has its inputs as its
    views (no (1, ...) view made of them)."""
    parts = [(keyed, inputs)]
    tickets = []
    named = _loss_inputs(m)
    for other in named:
        if len(other) != len(inputs) or any(a is b for a, b in zip(other, inputs)):
            continue
        plain = next(((p, layer) for p, (pk, like) in enumerate(parts)
                      if (layer := _plain_layer(other, pk[0], like)) is not None), None)
        if plain is not None:  # a layer of a part's stacks, told without looking for them
            tickets.append((*plain, other))
            continue
        k = _keyed(m, other, where, backend, alone=True, rest=keyed[2][2])
        if k is None:
            continue
        taken = next((p for p, (pk, _) in enumerate(parts)
                      if all(a is b for a, b in zip(k[1], pk[1])) and k[2] == pk[2]), None)
        if taken is None and all(t.device == o.device and tuple(t.shape) == tuple(o.shape)
                                 for t, o in zip(other, inputs)):
            taken = len(parts)
            parts.append((k, other))
        if taken is not None:  # a layer of a stack taken
            tickets.append((taken, k[0][0].layer, other))
    wanted = [[keyed[0][0].layer]] + [[] for _ in parts[1:]]  # each part's layers named (a taken part has one)
    for p, layer, _ in tickets:
        wanted[p].append(layer)
    found = []
    for (k, like), mine in zip(parts, wanted):
        first, layers = (min(mine), max(mine) + 1 - min(mine)) if named else (0, k[0][0].layers)
        if unstacked and layers == 1:  # the one layer named: the inputs of its call (like's layer is first)
            views = list(like)
        else:
            views = [stacked(t, f, first, layers) for t, f in zip(like, k[0])]
        found.append((k, like, views, first, layers))
    return found, tickets


def _plain_layer(tensors: Sequence[torch.Tensor], found: list, like: Sequence[torch.Tensor]) -> int | None:
    """The layer l of the stacks where ``like`` sit (``found``: their Layers) that ``tensors`` are, each the view of
    its stack that stacked() gives for layer l (the same dtype, shape and strides as ``like``'s, l steps from the
    stack's first layer: the same elements); else None (layer_of then tells)."""
    layer = None
    for t, f, o in zip(tensors, found, like):
        if (type(t) is not torch.Tensor or t._base is not f.stack or t.dtype != o.dtype or t.shape != o.shape
                or t.stride() != o.stride()):
            return None
        k, r = divmod(t.storage_offset() - f.stack.storage_offset() - f.where, f.step)
        if r != 0 or not 0 <= k < f.layers or layer not in (None, k):
            return None
        layer = k
    return layer


def by_dtypes(views: list, costs: Callable):
    """The problems of parts' stacked views (each part's list of (layers, ...) tensors), part after part, each run of
    parts of the same dtypes joined in one call of ``costs``: (problems, declined, kept: whether each part's layers
    are among the problems); None where the first part has no layered cost. A later run whose cost is None or of
    another dtype is left out (its calls go their own way)."""
    runs = []
    for k, part in enumerate(views):
        dtypes = tuple(v.dtype for v in part)
        if runs and runs[-1][0] == dtypes:
            runs[-1][1].append(k)
        else:
            runs.append((dtypes, [k]))
    found, flags, kept = [], [], [False] * len(views)
    for _, run in runs:
        stacks = [torch.cat(v) if len(v) > 1 else v[0] for v in zip(*(views[k] for k in run))]
        problems = costs(stacks)
        if problems is None and not found:
            return None
        problems, declined = problems if isinstance(problems, Guarded) else (problems, None)
        if problems is None or (found and (problems.dtype != found[0].dtype or problems.shape[1:] != found[0].shape[1:]
                                           or (declined is None) != (flags[0] is None))):
            continue
        found.append(problems)
        flags.append(declined)
        for k in run:
            kept[k] = True
    declined = None if flags[0] is None else functools.reduce(torch.logical_or, flags) if len(flags) > 1 else flags[0]
    return (torch.cat(found) if len(found) > 1 else found[0]), declined, kept


def _problems_of(parts: list, costs: Callable, joined: Callable | None):
    """(problems, declined, the indices of the parts solved) of the parts' layers, part after part: by ``joined``
    (every part's views at once -> by_dtypes's result, or None) where given, else by_dtypes with ``costs``; None where
    this call's own part has no layered cost."""
    views = [part[2] for part in parts]
    found = joined(views) if joined is not None else by_dtypes(views, costs)
    if found is None or not found[2][0]:
        return None
    problems, declined, kept = found
    return problems, declined, [p for p, k in enumerate(kept) if k]


def layered(m, inputs: Sequence[torch.Tensor], objects: Sequence[torch.Tensor], where: Layout, costs: Callable,
            backend: str, check: bool, batch_objects: bool = False, joined: Callable | None = None, tag=None,
            unstacked: bool = False):
    """This call's matches when each of ``inputs`` is one layer of a stack of a decoder's layers, the same layer of
    stacks of the same layers, or an output of a loss call in progress (loss_call); else None (a call of its own). At
    the stack's first call (for matcher ``m``), every layer's problems, with those of the loss call's other stacks,
    ``costs(stacked inputs)`` -> (layers * problems, queries per group, width) or None (no layered cost: a call of its
    own), are solved in one call of the op; the later calls of the same call (Memo) take their layer's matches.
    ``costs`` may return Guarded problems: None where declined. ``objects``: the tensors the cost reads besides the
    inputs (the rest it depends on: the matcher's settings, settings_of, and the autocast region). ``check``: SciPy's
    error at the call of a layer whose problem it refuses. The flag and the status of every layer are read at the
    first call, in one synchronisation. ``joined``: the problems of every part at once, where given (_problems_of).
    ``unstacked``: a part of one layer is handed to ``joined`` and ``costs`` as its call's inputs themselves, not as a
    stack of one layer (for costs that take either)."""
    seen = _seen(objects)
    keyed = None if seen is None else _keyed(m, inputs, where, backend, alone=bool(_loss_inputs(m)))
    if keyed is None:
        return None
    served = _take(_memos_of(m, objects), keyed, check)
    if served is not None:
        return served
    parts, tickets = _parts(m, inputs, keyed, where, backend, unstacked)
    with torch.no_grad():  # the views and costs of the layers record nothing for autograd
        found = _problems_of(parts, costs, joined)
        if found is None:
            return None
        problems, declined, solved = found
        counts = [parts[p][4] for p in solved]
        layers = sum(counts)
        rows, cols, info = solve(problems, where, backend, layers)
        per_layer = matches(rows, cols, where, layers, batch_objects)
        refused, codes = settle(declined, info, check)
        if refused:
            return None
    images, per = len(where.counts), info.shape[0] // layers
    memos, first = [], 0
    for part, n in zip(solved, counts):
        (_, stacks, key), lo = parts[part][0], parts[part][3]  # the part's layers lo to lo + n - 1
        results = {lo + k: per_layer[(first + k) * images:(first + k + 1) * images] for k in range(n)}
        mine = None if codes is None else {lo + k: codes[(first + k) * per:(first + k + 1) * per] for k in range(n)}
        refs = [weakref.ref(t) for t in stacks]
        held = {id(call[0]): ([weakref.ref(t) for t in call], geometry, layer) for p, layer, call in tickets
                if p == part and (geometry := _geometry(call, refs)) is not None}
        memos.append(Memo(refs, key, results, (info, first - lo, layers), where, mine, held))
        first += n
    _MEMOS[m] = Solve(*seen, tag, memos)
    return memos[0].take(keyed[1], keyed[2], keyed[0][0].layer, check)
