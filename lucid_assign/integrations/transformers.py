"""transformers' DETR-family matchers on lucid-assign's batched linear sum assignment.

Every detection matcher of ``transformers/loss/`` computes a (batch, queries, all objects of the batch) cost on the
device, copies it to the host (``.view(batch, queries, -1).cpu()``), splits it by the images' object counts and calls
SciPy's ``linear_sum_assignment`` once per image (LW-DETR's and RF-DETR's once per image and query group). patch()
replaces each matcher's ``forward``: the matcher's own code computes its cost, exactly as unpatched, up to the copy
to the host; there the patched forward takes the cost on its device and matches every image (and group) in one call
of ``torch.ops.lucid.linear_sum_assignment``, SciPy's choice, ties included. It returns what the matcher returns: per
image the matched queries in ascending order and their objects, int64 index tensors, on the cost's device (the
matcher's are on the CPU).

Each patched class checks itself once, at its first call in a process: it also runs the matcher's own forward on
those inputs (SciPy on the host, one synchronisation) and compares the matches; a class that differs goes back to its
own forward for the rest of the process, said once. patch_report() says what was patched and what was left.

    from lucid_assign.integrations import transformers as lucid_transformers
    lucid_transformers.patch()   # before training; unpatch() restores the classes
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import logging
import threading
import warnings
import weakref
from typing import NamedTuple

import numpy as np
import torch

from .. import api, ops

LOGGER = logging.getLogger("lucid_assign")


class Matcher(NamedTuple):
    module: str  # where transformers defines it
    sizes_key: str  # the targets' key whose length is an image's object count (the matcher's own)
    grouped: bool  # forward(outputs, targets, group_detr): the queries in group_detr groups, each matched alone
    layered: bool  # its cost reads only outputs["logits"] and outputs["pred_boxes"], and draws no random numbers:
    # the layers of a decoder's stacked outputs can be matched at once (_from_layers)


# transformers 5.x, transformers/loss/ (docs/usage.md, "transformers")
MATCHERS = {
    "HungarianMatcher": Matcher("transformers.loss.loss_for_object_detection", "boxes", False, True),
    "DeformableDetrHungarianMatcher": Matcher("transformers.loss.loss_deformable_detr", "boxes", False, True),
    "RTDetrHungarianMatcher": Matcher("transformers.loss.loss_rt_detr", "boxes", False, True),
    "LwDetrHungarianMatcher": Matcher("transformers.loss.loss_lw_detr", "boxes", True, True),
    "RfDetrHungarianMatcher": Matcher("transformers.loss.loss_rf_detr", "masks", True, False),
    "GroundingDinoHungarianMatcher": Matcher("transformers.loss.loss_grounding_dino", "boxes", False, False),
}

_state = threading.RLock()
_originals: dict | None = None  # class -> its own forward, while patched
_report: dict = {}  # class name -> what patch() did
_backend = "auto"
_verified: dict = {}  # class -> True (checked, same) / False (differs: its own forward from then on); kept for the
# process, across patch() and unpatch()
_said: set = set()


class _Cost(Exception):
    """Raised out of a matcher's own forward at its copy to the host, carrying the cost it was copying."""

    def __init__(self, cost: torch.Tensor):
        super().__init__("the matcher's cost")
        self.cost = cost


_taking = threading.local()  # .on: this thread's patched forward waits for its matcher's cost
_hook_users = 0  # patched forwards in flight (all threads) while Tensor.cpu is hooked
_hook_saved = None  # what torch.Tensor itself defined as cpu before the hook (None: nothing, TensorBase's)


def _cpu_or_take(self, *args, **kwargs):
    """Tensor.cpu while a patched forward runs somewhere: in the thread of that forward, the matcher's 3-D cost is
    taken at its copy to the host, not copied; every other call is torch's own."""
    if getattr(_taking, "on", False) and self.dim() == 3:
        _taking.on = False
        raise _Cost(self)
    return torch._C.TensorBase.cpu(self, *args, **kwargs) if _hook_saved is None else _hook_saved(self, *args, **kwargs)


@contextlib.contextmanager
def _take_cost():
    """Stops this thread's matcher at Tensor.cpu of its 3-D cost (raising _Cost). Tensor.cpu is hooked only while a
    patched forward runs: one Python call on each copy to the host, where a torch function mode would intercept every
    tensor operation of the matcher (over a hundred a call, about as much host time as the operations themselves)."""
    global _hook_users, _hook_saved
    with _state:
        if _hook_users == 0:
            _hook_saved = vars(torch.Tensor).get("cpu")
            torch.Tensor.cpu = _cpu_or_take
        _hook_users += 1
    _taking.on = True
    try:
        yield
    finally:
        _taking.on = False
        with _state:
            _hook_users -= 1
            if _hook_users == 0:
                if _hook_saved is None:
                    del torch.Tensor.cpu
                else:
                    torch.Tensor.cpu = _hook_saved
                _hook_saved = None


def _say_once(message: str) -> None:
    if message not in _said:
        _said.add(message)
        warnings.warn(message, api.FallbackWarning, stacklevel=3)


class Layout(NamedTuple):
    """Where the matches of one call go, computed on the host from the object counts and copied in one transfer."""

    columns: torch.Tensor  # (images, width): the cost's column of each object slot (padding repeats the last)
    pairs: torch.Tensor  # the flat places, in the op's (problems, K) outputs, of each image's matches in order
    query_offset: torch.Tensor  # per match: the first query of its group
    per_image: list  # matches per image
    sizes: torch.Tensor  # (images * groups): the objects of each problem (image b's group g is problem b * groups + g)


def layout(sizes: list, queries: int, groups: int, device) -> Layout:
    """The Layout of a cost with ``queries`` queries in ``groups`` groups against images of ``sizes`` objects. The last
    few are kept (read-only tensors): the matcher calls of one training step share one, and its transfer."""
    return _layout(tuple(int(s) for s in sizes), int(queries), int(groups), torch.device(device))


@functools.lru_cache(maxsize=8)
def _layout(sizes: tuple, queries: int, groups: int, device: torch.device) -> Layout:
    n = np.asarray(sizes, dtype=np.int64)
    images, width, per_group = len(sizes), max(int(n.max()), 1), queries // groups
    starts = np.cumsum(n) - n
    total = int(n.sum())
    slot = np.arange(width)
    columns = np.minimum(starts[:, None] + np.minimum(slot[None], np.maximum(n - 1, 0)[:, None]), max(total - 1, 0))
    k = np.minimum(n, per_group)
    # problem b * groups + g holds image b's group g; its k[b] matches come first in its row of the op's outputs
    per_problem = np.repeat(k, groups)
    first = np.repeat(np.arange(images * groups) * min(per_group, width), per_problem)
    rank = np.arange(int(per_problem.sum())) - np.repeat(np.cumsum(per_problem) - per_problem, per_problem)
    pairs = first + rank
    query_offset = np.repeat(np.tile(np.arange(groups) * per_group, images), per_problem)
    sizes_per_problem = np.repeat(n, groups)
    packed = np.concatenate((columns.reshape(-1), pairs, query_offset, sizes_per_problem)).astype(np.int64)
    parts = torch.from_numpy(packed).to(device, non_blocking=True).split(
        [columns.size, len(pairs), len(pairs), len(sizes_per_problem)])
    return Layout(parts[0].view(images, width), parts[1], parts[2], (k * groups).tolist(), parts[3])


def match(cost: torch.Tensor, sizes: list, groups: int = 1, backend: str = "auto", check: bool = False) -> list:
    """The matcher's result from its (batch, queries, all objects) cost: SciPy's matches of each image (and group),
    as (queries ascending, objects of the image) int64 tensors on the cost's device, without synchronising.

    ``check``: raise SciPy's ValueError, with SciPy's words, where a problem's cost holds NaN or -inf or admits no
    complete matching, as the matcher's loop over SciPy would (one synchronisation); for matchers whose cost can hold
    such values (those that do not replace them, see _sanitizes)."""
    results, info = _match_problems([_problems(cost, sizes, groups)], cost.shape[:2], sizes, groups, backend,
                                    cost.device)
    if check:
        _raise_refused(info[0])
    return results[0]


def _problems(cost: torch.Tensor, sizes: list, groups: int) -> torch.Tensor | None:
    """The op's problems of a (batch, queries, all objects) cost: (batch * groups, queries per group, most objects),
    each image's objects first (a gather: exact), its queries in groups (problem b * groups + g); None where the cost
    holds none."""
    bs, nq, total = cost.shape
    if total == 0 or bs == 0:
        return None
    where = layout(sizes, nq, groups, cost.device)
    per_group = nq // groups
    padded = cost.gather(2, where.columns[:, None, :].expand(bs, nq, where.columns.shape[1]))
    return padded[:, : per_group * groups].reshape(bs * groups, per_group, -1)


def _match_problems(problems: list, shape: tuple, sizes: list, groups: int, backend: str, device) -> tuple:
    """The matches of several costs' problems (the layers of a decoder, each cut by _problems from a cost of
    ``shape`` (batch, queries) against the same objects, on ``device``), all solved in one call of the op: (each
    cost's result, the op's status as (costs, images, groups), or None where there are no problems)."""
    bs, nq = shape
    if problems[0] is None:
        empty = torch.zeros(0, dtype=torch.int64, device=device)
        return [[(empty, empty) for _ in range(bs)] for _ in problems], None
    where = layout(sizes, nq, groups, device)
    sizes_of = where.sizes if len(problems) == 1 else where.sizes.repeat(len(problems))
    if api.resolve_backend(backend) == "reference":
        rows, cols, info = api.lsap.linear_sum_assignment(torch.cat(problems), sizes_of)
    else:
        rows, cols, info = ops.linear_sum_assignment(torch.cat(problems), sizes_of)
    rows, cols = rows.view(len(problems), -1), cols.view(len(problems), -1)
    results = []
    for n in range(len(problems)):
        queries = (rows[n][where.pairs] + where.query_offset).split_with_sizes(where.per_image)
        objects = cols[n][where.pairs].split_with_sizes(where.per_image)
        results.append(list(zip(queries, objects)))
    return results, info.view(len(problems), bs, groups)


def _raise_refused(info: torch.Tensor | None) -> None:
    """SciPy's ValueError for the first problem (images, groups) that SciPy's loop would refuse: the groups' loop is
    outside the images' (LW-DETR's order). Reads ``info``: one synchronisation."""
    if info is None:
        return
    refused = next((code for code in info.t().reshape(-1).tolist() if code), 0)
    if refused:
        raise ValueError(api.lsap.INFO_MESSAGES[refused])


def _same(ours: list, theirs: list) -> bool:
    return len(ours) == len(theirs) and all(
        torch.equal(a.cpu(), c.cpu()) and torch.equal(b.cpu(), d.cpu()) for (a, b), (c, d) in zip(ours, theirs))


def _sanitizes(own) -> bool:
    """Whether a matcher's forward replaces NaN and infinite costs before its copy to the host (transformers 5.18 and
    later: ``torch.nan_to_num``), so that SciPy never refuses them; read from its source. Earlier versions pass such
    costs to SciPy, which raises: their patched calls check the op's status (one synchronisation) to raise as well.
    Without its source a matcher is checked."""
    try:
        return "nan_to_num" in inspect.getsource(own)
    except (OSError, TypeError):
        return False


def _patched_forward(cls, own, spec: Matcher):
    check = not _sanitizes(own)

    @functools.wraps(own)
    def forward(self, outputs, targets, *args, **kwargs):
        if _verified.get(cls) is False or not _runs_here(outputs):
            return own(self, outputs, targets, *args, **kwargs)
        checking = cls not in _verified
        groups = int(args[0] if args else kwargs.get("group_detr", 1)) if spec.grouped else 1
        sizes = [len(t[spec.sizes_key]) for t in targets]
        if spec.layered and not checking and len(args) + len(kwargs) == spec.grouped:
            found = _from_layers(self, own, outputs, targets, sizes, groups, check, args, kwargs)
            if found is not None:
                return found
        # A checked call runs the matcher twice, and a cost may draw random numbers (RF-DETR's mask points): the taken
        # run draws from a copy of the generators, so that the matcher's own run draws the same numbers (the same
        # cost) and leaves the generators as an unpatched call does.
        generators = torch.random.fork_rng(devices=_cuda_devices(outputs)) if checking else contextlib.nullcontext()
        try:
            with generators, _take_cost():
                result = own(self, outputs, targets, *args, **kwargs)
        except _Cost as taken:
            cost = taken.cost
        else:  # it never copied a cost to the host: nothing to take over
            _verified[cls] = False
            _say_once(f"lucid-assign: transformers' {cls.__name__} copied no cost to the host; it runs as it is")
            return own(self, outputs, targets, *args, **kwargs) if checking else result
        with torch.no_grad():
            ours = match(cost.detach(), sizes, groups, _backend, check)
        if checking:  # once per class and process: against the matcher's own forward
            theirs = own(self, outputs, targets, *args, **kwargs)
            _verified[cls] = _same(ours, theirs)
            if not _verified[cls]:
                _report[cls.__name__] = "left to transformers (its first call matched differently)"
                _say_once(f"lucid-assign: the patched {cls.__name__} matched differently from transformers' own at "
                          "its first call; it runs transformers' own matching from now on")
                return theirs
            LOGGER.info("lucid-assign: transformers' %s matches on %s with lucid-assign's kernel", cls.__name__,
                        cost.device)
        return ours

    forward.__lucid_patched__ = True
    return forward


# --- the layers of one loss call matched at once ------------------------------------------------------------------
# The losses call the matcher once per decoder layer (RT-DETR: the last layer, then the others as auxiliary outputs,
# then the encoder's proposals), each call on one layer of the decoder's stacked outputs (a view of a (B, L, Q, C) or
# (L, B, Q, C) tensor). The first call on a layer of a stack computes the cost of every layer of that stack with the
# matcher's own forward (each layer's view as the loss would pass it: the same elements, strides and operations, so
# the same cost) and matches their problems in one call of the op, so that the layers' solves run side by side on the
# device; the later calls take their layer's matches. The problems are independent, so each layer's matches are
# those of a call of its own.
MAX_LAYERS = 16
_STACKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # matcher -> its last stack's _Layers


class _Layer(NamedTuple):
    stack: torch.Tensor  # the tensor whose elements hold every layer (the view's base)
    step: int  # elements from one layer to the next
    layer: int  # the view's layer
    layers: int
    where: int  # the view's first element in its layer


def _layer_of(t) -> _Layer | None:
    """Where ``t`` sits in the stacked outputs of a decoder's layers, or None. Two shapes of stack: ``t`` is
    ``stack.select(dim, layer)`` sliced along the other dims (indexing and splitting a (B, L, Q, C) or (L, B, Q, C)
    tensor), or a contiguous block of a contiguous stack (a head's output over the flattened layers, viewed as (L, B,
    Q, C)); 2 to MAX_LAYERS layers. Any view of the same storage with the same geometry is served the same cost, so
    a stack that is not a decoder's costs work, never a wrong match."""
    if type(t) is not torch.Tensor or type(t._base) is not torch.Tensor:  # a subclass (a trace's fake tensor, say)
        return None
    stack = t._base
    if stack.dtype != t.dtype or not stack.is_contiguous() or t.numel() == 0:
        return None
    offset = t.storage_offset() - stack.storage_offset()
    if stack.dim() == t.dim() + 1 and min(stack.stride()) > 0:
        index = [(offset // stride) % size for size, stride in zip(stack.shape, stack.stride())]
        if sum(i * stride for i, stride in zip(index, stack.stride())) == offset:
            for dim in range(stack.dim()):
                rest = [k for k in range(stack.dim()) if k != dim]
                if (1 < stack.shape[dim] <= MAX_LAYERS and tuple(stack.stride(k) for k in rest) == t.stride()
                        and all(index[k] + t.shape[j] <= stack.shape[k] for j, k in enumerate(rest))):
                    step = stack.stride(dim)
                    return _Layer(stack, step, index[dim], stack.shape[dim], offset - index[dim] * step)
    step = t.numel()
    layers, rest = divmod(stack.numel(), step)
    if t.is_contiguous() and offset % step == 0 and rest == 0 and 1 < layers <= MAX_LAYERS:
        return _Layer(stack, step, offset // step, layers, 0)
    return None


def _layer_view(t: torch.Tensor, found: _Layer, other: int) -> torch.Tensor:
    """Layer ``other``'s view of the stack, as ``t`` is its layer's."""
    return found.stack.as_strided(t.shape, t.stride(), t.storage_offset() + (other - found.layer) * found.step)


def _state_of(m, outputs: dict, targets: list, groups: int) -> tuple:
    """What a layer's matches depend on besides its layer: the stacks and the views' geometry (with the tensors'
    version counters: unchanged), the objects (the targets' tensors, unchanged), the query groups and the matcher's
    settings."""
    views = tuple((outputs[k].shape, outputs[k].stride(), outputs[k]._base._version)
                  for k in ("logits", "pred_boxes"))
    objects = tuple((k, id(v), v._version) for t in targets for k, v in t.items() if isinstance(v, torch.Tensor))
    settings = tuple(sorted((k, v) for k, v in vars(m).items() if isinstance(v, (bool, int, float, str))))
    return views, objects, groups, settings


class _Layers:
    """Every layer's matches of one stack against one batch of objects, each handed out once. It keeps weak
    references to the stacks and the targets' tensors (never the autograd graph alive) and serves a later call only
    while they are the same tensors, unchanged, in the same geometry and with the matcher's same settings."""

    def __init__(self, found: tuple, results: list, info, state: tuple, refs: list):
        self._stacks = tuple(weakref.ref(f.stack) for f in found)
        self._refs = refs
        self._where = tuple((f.step, f.layers, f.where) for f in found)
        self._state = state
        self._layers = dict(enumerate(results))
        self._info = info

    def take(self, m, outputs: dict, targets: list, groups: int, found: tuple, check: bool):
        layer = found[0].layer
        if (layer not in self._layers or tuple((f.step, f.layers, f.where) for f in found) != self._where
                or any(ref() is not f.stack for ref, f in zip(self._stacks, found))
                or any(ref() is None for ref in self._refs) or _state_of(m, outputs, targets, groups) != self._state):
            return None
        if check:
            _raise_refused(None if self._info is None else self._info[layer])
        return self._layers.pop(layer)


def _from_layers(m, own, outputs, targets: list, sizes: list, groups: int, check: bool, args: tuple, kwargs: dict):
    """This call's matches from every layer of its outputs' stack (matched at the stack's first call), or None where
    its outputs are not one layer of a stack (the encoder's proposals, say) or a layer's cost could not be taken.
    ``args`` and ``kwargs``: the call's own beyond outputs and targets (LW-DETR's group_detr)."""
    if not isinstance(outputs, dict) or not all(isinstance(t, dict) for t in targets):
        return None
    logits, boxes = outputs.get("logits"), outputs.get("pred_boxes")
    found = (_layer_of(logits), _layer_of(boxes))
    if None in found or found[0].layer != found[1].layer or found[0].layers != found[1].layers:
        return None
    memo = _STACKS.get(m)
    if memo is not None:
        taken = memo.take(m, outputs, targets, groups, found, check)
        if taken is not None:
            return taken
    problems = []
    with torch.no_grad():  # the views and costs of the layers record nothing for autograd
        for other in range(found[0].layers):
            view = {"logits": _layer_view(logits, found[0], other), "pred_boxes": _layer_view(boxes, found[1], other)}
            try:
                with _take_cost():
                    own(m, view, targets, *args, **kwargs)
            except _Cost as taken:  # cut to its problems at once: the layers' full costs are not held together
                problems.append(_problems(taken.cost.detach(), sizes, groups))
            except Exception:  # a layer the matcher refuses: every call on its own, the refusal at that layer's call
                return None
            else:
                return None
        results, info = _match_problems(problems, logits.shape[:2], sizes, groups, _backend, logits.device)
    refs = [weakref.ref(v) for t in targets for v in t.values() if isinstance(v, torch.Tensor)]
    memo = _STACKS[m] = _Layers(found, results, info, _state_of(m, outputs, targets, groups), refs)
    return memo.take(m, outputs, targets, groups, found, check)


def _cuda_devices(outputs) -> list:
    """The CUDA device of the matcher's inputs, as torch.random.fork_rng takes it (none on other devices)."""
    logits = outputs.get("logits") if isinstance(outputs, dict) else None
    return [logits.device] if isinstance(logits, torch.Tensor) and logits.device.type == "cuda" else []


def _runs_here(outputs) -> bool:
    if api.resolve_backend(_backend) == "reference":
        return True
    logits = outputs.get("logits") if isinstance(outputs, dict) else None
    device = logits.device.type if isinstance(logits, torch.Tensor) else "cpu"
    why = api.device_unsupported(device, "linear_sum_assignment")
    if why is not None:
        if _backend == "kernel":
            raise RuntimeError(f"backend='kernel' cannot run the matcher: {why}")
        _say_once(f"lucid-assign: transformers' matchers cannot run the kernel here ({why}); they run as they are. "
                  f"Fix: {api.kernel_fix(device, why)}")
    return why is None


def _classes() -> dict:
    """The matcher classes of the installed transformers: name -> class (None where this version has none)."""
    found = {}
    for name, spec in MATCHERS.items():
        try:
            module = importlib.import_module(spec.module)
        except Exception:  # a version without that loss, or one that fails to import without SciPy
            module = None
        cls = getattr(module, name, None) if module is not None else None
        found[name] = cls if isinstance(cls, type) and "forward" in vars(cls) else None
    return found


def patch(backend: str = "auto") -> None:
    """Make transformers' DETR-family matchers match on the device with lucid-assign's op.

    ``backend``: "auto" (the kernel where it runs, else the matcher as it is, said once), "kernel" (raise where it
    cannot run) or "reference" (lucid-assign's pure solver). Idempotent; ``unpatch()`` restores the classes."""
    global _originals, _backend
    api.resolve_backend(backend)  # refuses an unknown backend
    with _state:
        if _originals is not None:
            _backend = backend
            return
        try:
            import scipy.optimize  # noqa: F401
        except ImportError:
            scipy = False
        else:
            scipy = True
        _report.clear()
        _originals = {}
        for name, cls in _classes().items():
            if cls is None:
                _report[name] = "not in this version of transformers"
            elif not scipy:
                _report[name] = "left to transformers (no SciPy: it cannot match at all)"
            else:
                _originals[cls] = vars(cls)["forward"]
                cls.forward = _patched_forward(cls, _originals[cls], MATCHERS[name])
                _report[name] = ("left to transformers (its first call matched differently)"
                                 if _verified.get(cls) is False else "patched")
        _backend = backend


def unpatch() -> None:
    """Restore every patched class's own forward."""
    global _originals
    with _state:
        for cls, forward in (_originals or {}).items():
            cls.forward = forward
        _originals = None


def is_patched() -> bool:
    return _originals is not None


@contextlib.contextmanager
def patched(backend: str = "auto"):
    """Patch for the block, then restore what was there before it."""
    was, before = is_patched(), _backend
    patch(backend)
    try:
        yield
    finally:
        if was:
            patch(before)
        else:
            unpatch()


def patch_report() -> list:
    """One line per matcher class: patched, left to transformers (why), or not in this version."""
    return [f"{name}: {what}" for name, what in _report.items()]
