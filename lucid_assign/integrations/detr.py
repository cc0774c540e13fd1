"""Any DETR-style matcher on lucid-assign's batched linear sum assignment, its own cost untouched.

Most DETR trainers that are repositories rather than packages (the official DETR, Deformable, Conditional, DAB- and
DN-DETR, DINO, RT-DETR(v2), D-FINE, DEIM and their forks) share one matcher pattern: the cost of every (query, object)
pair of the batch is built on the device, copied to the host (``C.view(bs, num_queries, -1).cpu()``), split by the
images' object counts (``C.split(sizes, -1)``), and each image's block goes to SciPy's ``linear_sum_assignment``
(``[linear_sum_assignment(c[i]) for i, c in enumerate(C.split(sizes, -1))]``); some solve again with the matched
queries masked in the copy (one-to-many matching).

``patch(matcher)`` (a class, or ``"module:Class"``) leaves the class's cost as it is and wraps its ``forward``; the
names its methods' modules bind to SciPy's function answer from lucid-assign while a patched forward runs (in that
thread), and are SciPy's own everywhere else. In a patched call:

- each ``.cpu()`` copy of a 2-D or 3-D floating tensor is noted (the tensor on its device and the copy; the copy is
  made into page-locked memory, the same values, dtype, shape and strides as ``.cpu()``'s, or as before where
  ``PAGE_LOCKED`` is off), and each ``split`` of such a copy along its last dim;
- a block handed to SciPy that is an image's block of a noted split (``c[i]`` of the i-th piece), unchanged since
  the copy, is solved on the device the cost was built on, together with every other image's block of that split:
  one call of ``torch.ops.lucid.linear_sum_assignment`` and one transfer of the matches, which are then handed out,
  SciPy's arrays, as the forward asks for them;
- a block of a copy changed in place since it was made (the one-to-many variant's masked queries) is solved on the
  CPU, from the copy's current values, with the same split's other blocks; a block of a copy that no split covers,
  alone;
- anything else (a NumPy array, a block made otherwise than by slicing the copy, a dtype SciPy cannot take, a
  device the kernel cannot run on) goes to SciPy itself, said once with the reason; so does a problem SciPy refuses
  (NaN, -inf, infeasible), so that SciPy raises its own error.

What the forward returns is what it returned: its own code runs on SciPy's matches (the op's are SciPy's, ties
included). ``unpatch()`` restores the classes and the names; ``patch_report()`` says what was patched.

    from lucid_assign.integrations import detr as lucid_detr
    lucid_detr.patch("models.matcher:HungarianMatcher")   # before training

``lucid-assign run --matcher models.matcher:HungarianMatcher -- python train.py ...`` patches it in every Python
process of the run (docs/usage.md).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import threading
from typing import NamedTuple

import numpy as np
import torch

from .. import __version__, dispatch
from . import _matching as core
from ._patching import DETR as STATE

SPLIT = core.TensorHook("split")  # a copy's split by the images' object counts
# Copies of CUDA costs made into page-locked memory (torch's caching host allocator): the same copy (values, dtype,
# shape, strides), which the copy engine fills several times faster than the pageable memory .cpu() allocates; that
# copy, 61 MB a layer at 16 x 300 x 3,200, is most of a loss call (docs/performance.md). False: .cpu()'s own copy.
PAGE_LOCKED = True
_DTYPES = (torch.float16, torch.float32, torch.float64)  # the copies' dtypes SciPy takes (and the op widens exactly)
_local = threading.local()  # .session: the patched forward running in this thread, or None

# STATE (_patching.py): originals, class -> its own forward (None: inherited), while any is patched; report; backend
_bound: dict = {}  # (id of a module's globals, name) -> (that globals dict, SciPy's function, the classes using it)
_solver = None  # the one replacement of SciPy's function (_patched_solver), made at the first patch()


def _scipy(*args, **kwargs):
    """SciPy's own linear_sum_assignment."""
    from scipy.optimize import linear_sum_assignment

    return linear_sum_assignment(*args, **kwargs)


class _Copy:
    """A ``.cpu()`` copy made in a patched call: the tensor on its device, the copy, and both version counters then."""

    def __init__(self, device: torch.Tensor, host: torch.Tensor):
        self.device, self.host = device, host
        self.versions = self.now()

    def now(self) -> tuple:
        return self.device._version, self.host._version

    def block(self, t: torch.Tensor):
        """Where the 2-D or 3-D view ``t`` lies in the copy, as (first image, images, first row, rows, first column,
        columns) of the copy seen as (images, rows, columns); None where it is not such a view."""
        host = self.host
        if not host.is_contiguous() or t.dim() not in (2, 3) or host.dim() < t.dim():
            return None
        shape = tuple(host.shape) if host.dim() == 3 else (1, *host.shape)
        if 0 in shape:
            return None
        strides = (shape[1] * shape[2], shape[2], 1)
        if t.numel() and tuple(s for s, n in zip(t.stride(), t.shape) if n > 1) != tuple(
                s for s, n in zip(strides[3 - t.dim():], t.shape) if n > 1):
            return None
        offset = t.storage_offset() - host.storage_offset()
        if offset < 0:
            return None
        b, rest = divmod(offset, strides[0])
        r, c = divmod(rest, strides[1])
        nb, nr, nc = (1, *t.shape) if t.dim() == 2 else tuple(t.shape)
        if b + nb > shape[0] or r + nr > shape[1] or c + nc > shape[2]:
            return None
        return b, nb, r, nr, c, nc


class _Split(NamedTuple):
    """A copy's split along its last dim: the split view's place in the copy and the pieces' sizes."""

    copy: _Copy
    first: int  # image
    images: int
    row: int
    rows: int
    column: int
    sizes: tuple


class _Solved(NamedTuple):
    versions: tuple  # the copy's version counters when solved
    pairs: list  # per block: (rows, cols) NumPy int64 arrays, or None where SciPy refuses the problem


class _Session:
    """One patched forward call: its copies, their splits, the blocks solved."""

    def __init__(self, cls):
        self.cls = cls
        self.copies: list = []
        self.splits: list = []
        self.solved: dict = {}
        self.busy = False  # lucid-assign's own code is running: its copies and splits are not the matcher's
        self.asked = 0  # linear_sum_assignment calls

    def on_cpu(self, tensor, args, kwargs):
        if (self.busy or args or kwargs or type(tensor) is not torch.Tensor or tensor.dim() not in (2, 3)
                or tensor.dtype not in _DTYPES):
            return core.HOST_COPY.own(tensor, *args, **kwargs)
        if PAGE_LOCKED and tensor.device.type == "cuda" and not (tensor.requires_grad and torch.is_grad_enabled()):
            host = torch.empty_like(tensor, device="cpu", pin_memory=True)
            host.copy_(tensor)
        else:
            host = core.HOST_COPY.own(tensor)
        if not (tensor.is_inference() or host.is_inference()):  # those track no versions: changes would go unseen
            self.copies.append(_Copy(tensor, host))
        return host

    def on_split(self, tensor, args, kwargs):
        pieces = SPLIT.own(tensor, *args, **kwargs)
        if not self.busy and self.copies and tensor.dim() == 3:
            size = args[0] if args else kwargs.get("split_size", kwargs.get("split_size_or_sections"))
            dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
            if isinstance(dim, int) and dim % 3 == 2:
                sizes = tuple(p.shape[2] for p in pieces)
                copy = self._copy_of(tensor)
                place = copy.block(tensor) if copy is not None and isinstance(size, (int, list, tuple)) else None
                if place is not None:
                    split = _Split(copy, place[0], place[1], place[2], place[3], place[4], sizes)
                    if split not in self.splits:
                        self.splits.append(split)
        return pieces

    def _copy_of(self, t: torch.Tensor):
        if t.device.type != "cpu":
            return None
        ptr = t.untyped_storage().data_ptr()
        for copy in reversed(self.copies):
            if copy.host.untyped_storage().data_ptr() == ptr:
                return copy
        return None

    def solve(self, cost, maximize):
        """SciPy's (row_ind, col_ind) for ``cost``, or None: SciPy itself then (unrecognised, or refused)."""
        self.asked += 1
        if type(cost) is not torch.Tensor:
            return self._unrecognised(f"handed SciPy a {type(cost).__name__}, not a view of a cost copied from the "
                                      "device with .cpu()")
        if cost.dim() != 2 or cost.dtype not in _DTYPES or cost.requires_grad:
            return self._unrecognised(f"handed SciPy a {cost.dim()}-D {cost.dtype} tensor"
                                      f"{' that requires grad' if cost.requires_grad else ''}")
        if cost.numel() == 0:  # SciPy's answer for an empty matrix
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        copy = self._copy_of(cost)
        place = copy.block(cost) if copy is not None else None
        if place is None:
            return self._unrecognised("handed SciPy a cost that is no block of one it copied from the device with "
                                      ".cpu() (a new tensor, or one transposed or strided)")
        b, _, r, nr, c, n = place
        for split in reversed(self.splits):  # the image's block of a split, solved with the split's other images
            if split.copy is copy and split.row == r and split.rows == nr and len(split.sizes) == split.images:
                j = b - split.first
                if 0 <= j < split.images and split.sizes[j] == n and split.column + sum(split.sizes[:j]) == c:
                    return self._pairs(copy, (split.first, r, nr, split.column, split.sizes), j, maximize)
        return self._pairs(copy, (b, r, nr, c, (n,)), 0, maximize)

    def _pairs(self, copy: _Copy, blocks: tuple, j: int, maximize: bool):
        key = (id(copy), blocks, bool(maximize))
        solved = self.solved.get(key)
        if solved is None or solved.versions != copy.now():
            solved = self._solve(copy, blocks, bool(maximize))
            if solved is None:
                return None
            self.solved[key] = solved
        pairs = solved.pairs[j]
        return None if pairs is None else (pairs[0].copy(), pairs[1].copy())

    def _solve(self, copy: _Copy, blocks: tuple, maximize: bool):
        """Every block of ``blocks`` (first image, first row, rows, first column, sizes: image first + k's block is
        its rows against the k-th piece's columns) in one call of the op: on the device from the tensor copied while
        the copy is unchanged, else on the CPU from the copy's current values."""
        first, r, nr, c, sizes = blocks
        versions = copy.now()
        source = copy.device if versions == copy.versions else copy.host
        if source.dim() == 2:
            source = source[None]
        what = f"{self.cls.__name__}"
        backend = core.runs_here(STATE, STATE.effective_backend(), source.device.type, what)
        if backend is None:
            return None
        self.busy = True
        try:
            with torch.no_grad():
                pairs = _solve_blocks(source, first, r, nr, c, sizes, maximize, backend)
        finally:
            self.busy = False
        if not STATE.announced:
            said = f"{what} matches on {source.device} with lucid-assign's {backend}"
            STATE.verbose(said)
            STATE.announce(said, __version__)
        return _Solved(versions, pairs)

    def _unrecognised(self, why: str):
        STATE.say_once(f"lucid-assign: the patched {self.cls.__name__} {why}; such calls go to SciPy itself")
        return None

    def close(self):
        if self.copies and not self.asked:
            STATE.say_once(f"lucid-assign: the patched {self.cls.__name__} copied a cost to the host but called no "
                           "linear_sum_assignment by the names patch() replaced (its solver is called another way): "
                           "its calls run as they are")


def _solve_blocks(source: torch.Tensor, first: int, r: int, nr: int, c: int, sizes: tuple, maximize: bool,
                  backend: str) -> list:
    """Per block, SciPy's (rows, cols) as NumPy int64 arrays, or None where SciPy refuses it; one op call and one
    transfer to the host."""
    empty = np.zeros(0, dtype=np.int64)
    if nr == 0 or sum(sizes) == 0:
        return [(empty, empty) for _ in sizes]
    cost = source[first:first + len(sizes), r:r + nr, c:c + sum(sizes)]
    where = core.layout(sizes, nr, 1, source.device)
    problems = core.problems_of_cross_cost(cost, where)
    if problems.dtype == torch.float16:
        problems = problems.float()  # exact, as SciPy widens it
    if maximize:
        problems = -problems  # exact, as SciPy negates it
    rows, cols, info = core.solve(problems, where, backend)
    n, k = rows.numel(), rows.shape[1]
    found = core.HOST_COPY.own(torch.cat([rows.reshape(-1), cols.reshape(-1), info.reshape(-1).long()])).numpy()
    rows, cols, info = found[:n].reshape(-1, k), found[n:2 * n].reshape(-1, k), found[2 * n:]
    out = []
    for j, n in enumerate(sizes):
        m = min(nr, n)
        out.append(None if info[j] else (rows[j, :m], cols[j, :m]))
    return out


def _patched_solver(scipy_function):
    """What the matcher modules' names of SciPy's linear_sum_assignment become: SciPy's own outside a patched call
    (another thread's, code outside the forward), lucid-assign's in one."""

    @functools.wraps(scipy_function)
    def linear_sum_assignment(cost_matrix, maximize=False):
        session = getattr(_local, "session", None)
        if session is not None and not session.busy:
            found = session.solve(cost_matrix, maximize)
            if found is not None:
                return found
        return _scipy(cost_matrix, maximize=maximize)

    linear_sum_assignment.__lucid_patched__ = True
    return linear_sum_assignment


def _patched_forward(cls, own):
    @functools.wraps(own)
    def forward(self, *args, **kwargs):
        session = _Session(cls)
        before = getattr(_local, "session", None)
        _local.session = session
        try:
            with core.HOST_COPY.handled(session.on_cpu), SPLIT.handled(session.on_split):
                return own(self, *args, **kwargs)
        finally:
            _local.session = before
            session.close()

    forward.__lucid_patched__ = True
    return forward


# --- patch ------------------------------------------------------------------------------------------------------------


def _resolve(matcher) -> type:
    """The class named by ``matcher``: a class, or "module:Class" (Class may be dotted: "module:Outer.Inner")."""
    if isinstance(matcher, type):
        cls = matcher
    elif isinstance(matcher, str):
        module, sep, name = matcher.partition(":")
        if not sep or not module or not name:
            raise ValueError(f"matcher must be a class or 'module:Class', got {matcher!r}")
        try:
            obj = importlib.import_module(module)
        except ImportError as e:
            raise ImportError(f"matcher {matcher!r}: cannot import {module!r} ({e})") from e
        for part in name.split("."):
            if not hasattr(obj, part):
                raise AttributeError(f"matcher {matcher!r}: {obj.__name__} has no attribute {part!r}")
            obj = getattr(obj, part)
        cls = obj
    else:
        raise TypeError(f"matcher must be a class or 'module:Class', got {type(matcher).__name__}")
    if not isinstance(cls, type) or not callable(getattr(cls, "forward", None)):
        raise TypeError(f"matcher {matcher!r} is not a class with a forward method")
    return cls


def _name(cls) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _modules_of(cls) -> list:
    """The globals of the modules that define the class's methods (and its bases', short of torch.nn.Module's)."""
    found = {}
    for klass in cls.__mro__:
        if klass is object or klass.__module__.startswith("torch."):
            continue
        for value in vars(klass).values():
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            elif isinstance(value, property):
                value = value.fget
            for f in (value, inspect.unwrap(value) if callable(value) else None):
                g = getattr(f, "__globals__", None)
                if isinstance(g, dict):
                    found[id(g)] = g
    return list(found.values())


def patch(matcher, backend: str = "auto") -> None:
    """Make a DETR-style matcher class solve with lucid-assign's op, its cost left as it is (module docstring).

    ``matcher``: the class, or "module:Class". ``backend``: "auto" (the kernel where it runs, else SciPy, said once),
    "kernel" (raise where it cannot run) or "reference" (lucid-assign's pure solver); one backend for every patched
    matcher, the last patch()'s. Idempotent; ``unpatch()`` restores the class."""
    dispatch.resolve_backend(backend)  # refuses an unknown backend
    cls = _resolve(matcher)
    try:
        import scipy.optimize
    except ImportError as e:
        raise ImportError(f"patch({_name(cls)}): SciPy is needed (the matcher solves with it): {e}") from e
    with STATE.lock:
        STATE.backend = backend
        if cls in (STATE.originals or {}):
            return
        global _solver
        if _solver is None:
            _solver = _patched_solver(scipy.optimize.linear_sum_assignment)
        names = []
        for g in _modules_of(cls):
            for name, value in list(g.items()):
                if value is scipy.optimize.linear_sum_assignment or value is _solver:  # SciPy's, or replaced already
                    _bound.setdefault((id(g), name), (g, value, set()))[2].add(cls)
                    g[name] = _solver
                    names.append(f"{g.get('__name__', '?')}.{name}")
        if not names:
            STATE.report[_name(cls)] = ("left as it is: the modules of its methods bind no "
                                        "scipy.optimize.linear_sum_assignment (its solver is called another way)")
            STATE.say_once(f"lucid-assign: {_name(cls)} is left as it is: the modules of its methods bind no "
                           "scipy.optimize.linear_sum_assignment (its solver is called another way)")
            return
        originals = STATE.originals if STATE.originals is not None else {}
        originals[cls] = vars(cls).get("forward")  # None: inherited
        cls.forward = _patched_forward(cls, cls.forward)
        STATE.report[_name(cls)] = f"patched (SciPy's function as {', '.join(sorted(set(names)))})"
        STATE.originals = originals


def unpatch(matcher=None) -> None:
    """Restore the class's own forward (every patched class's with no argument) and the names of SciPy's function
    that no patched class uses any more."""
    with STATE.lock:
        originals = STATE.originals or {}
        classes = list(originals) if matcher is None else [c for c in originals if c is _resolve(matcher)]
        for cls in classes:
            own = originals.pop(cls)
            if own is None:
                del cls.forward
            else:
                cls.forward = own
            for key, (g, scipy_function, users) in list(_bound.items()):  # the names no patched class uses
                users.discard(cls)
                if not users:
                    if getattr(g.get(key[1]), "__lucid_patched__", False):
                        g[key[1]] = scipy_function
                    del _bound[key]
        STATE.originals = originals or None


def is_patched(matcher=None) -> bool:
    """Whether any matcher is patched (with no argument), or the one named."""
    if matcher is None:
        return STATE.is_patched()
    return _resolve(matcher) in (STATE.originals or {})


class patched:
    """``with patched(matcher, backend):`` patch for the block, then restore what was there before it."""

    def __init__(self, matcher, backend: str = "auto"):
        self.cls, self.backend = _resolve(matcher), backend

    def __enter__(self):
        self.was, self.before = is_patched(self.cls), STATE.backend
        patch(self.cls, self.backend)
        return self

    def __exit__(self, *exc):
        if not self.was:
            unpatch(self.cls)
        STATE.backend = self.before


def patch_report() -> list:
    """One line per matcher class patch() was given: patched (the names replaced), or left as it is (why)."""
    return [f"{name}: {what}" for name, what in STATE.report.items()]


