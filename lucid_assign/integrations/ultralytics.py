"""Make the peer trainer's (ultralytics) detection, OBB, pose and segmentation losses use lucid-assign's assigners.

    from lucid_assign.integrations import ultralytics as lucid_ultralytics
    lucid_ultralytics.patch()      # before the trainer builds its loss (the first training step)

What changes: the names ``TaskAlignedAssigner``, ``RotatedTaskAlignedAssigner``, ``PoseTaskAlignedAssigner`` and
``SegTaskAlignedAssigner`` of the peer's loss module (``ultralytics.utils.loss``; in early 8.0 releases
``ultralytics.yolo.utils.loss`` or the trainer modules), which ``v8DetectionLoss``, ``v8OBBLoss``, ``v8PoseLoss``,
``v8SegmentationLoss``, ``PoseLoss26``, ``SegmentLoss26`` and ``E2ELoss`` (YOLO26: one assignment with top-k 10 and one
with top-k 7 and top-k2 1) instantiate, become ``LucidTaskAlignedAssigner``, ``LucidRotatedTaskAlignedAssigner``,
``LucidPoseTaskAlignedAssigner`` and ``LucidSegTaskAlignedAssigner``, each with the rule set of the installed
release (docs/spec.md, "Rule sets") and that release's constructor. Losses built before ``patch()`` keep the
assigner they have. The speed and memory of the assignment change; its results do not.

- Multi-GPU: the peer trains on several GPUs by writing a script that ``torch.distributed.run`` starts once per GPU;
  those processes import the peer afresh. While patched, every such script first patches its own process with the
  same backend, so every rank builds lucid-assign's assigners.
- The command line: ``lucid-assign yolo ARGS`` runs the peer's ``yolo ARGS`` patched (lucid_assign.__main__).
- No silent slowdown: with ``backend="auto"``, a call the kernel cannot take (library not loaded, no CUDA kernels
  built, a dtype it lacks) is handed to the peer's own assigner, so training runs at the peer's speed, and that is
  said once per reason, with the fix, as a ``FallbackWarning``. ``backend="kernel"`` raises instead;
  ``backend="reference"`` runs lucid-assign's pure-PyTorch reference.
- No silent divergence: ``patch()`` runs each of the installed peer's assigners and lucid-assign's reference under
  each rule set on small built-in batches (on the CPU, ties to the lower index), never choosing by the version
  string; it patches each assigner with the rule set that gives its results and leaves the others to the peer, said
  once with the reason. docs/releases.md lists what this gives for each release from 8.0 to 8.4.
- ``LUCID_ASSIGN_VERBOSE=1`` prints, per process, when it is patched and what each patched assigner's first call ran
  (evidence that every rank of a multi-GPU run uses the kernel).

Left on the peer's code, on purpose: any call that passes other extra inputs to a patched assigner is handed to the
peer's class.

Nothing is imported from ultralytics until ``patch()`` is called; a missing package gives a clear error.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import itertools
import os
import sys
import types

import torch
from torch.overrides import TorchFunctionMode

from .. import __version__, _library, api, reference
from ..reference import INPUTS, SEG_INPUTS
from .. import assigner as _ours
from ..synthetic import check_batch, pose_batch, seg_batch

VERIFIED_VERSION = "8.4.190"  # the release the package's own tests run against
TESTED_RANGE = ">=8.0.200,<8.5"  # the releases the survey ran (docs/releases.md); the extra's requirement
_NAMES = ("TaskAlignedAssigner", "RotatedTaskAlignedAssigner", "PoseTaskAlignedAssigner", "SegTaskAlignedAssigner")
_SEG_KEYS = frozenset(SEG_INPUTS)
VERBOSE_ENV = "LUCID_ASSIGN_VERBOSE"
# Where the peer keeps its modules: ultralytics.utils since 8.0.1xx, ultralytics.yolo before, where the earliest
# releases built their losses in each task's trainer module.
_TAL_MODULES = ("ultralytics.utils.tal", "ultralytics.yolo.utils.tal")
_LOSS_MODULES = ("ultralytics.utils.loss", "ultralytics.yolo.utils.loss", "ultralytics.yolo.v8.detect.train",
                 "ultralytics.yolo.v8.segment.train", "ultralytics.yolo.v8.pose.train")
_DIST_MODULES = ("ultralytics.utils.dist", "ultralytics.yolo.utils.dist")

_originals: dict | None = None  # (module, name) -> the peer's object that patch() replaced
_rules: dict = {}  # assigner name -> the rule set its patched class reproduces
_left: dict = {}  # assigner name -> why patch() left it to the peer
_backend = "auto"  # the backend of the current patch
_said: set = set()
_announced = False  # whether this process said that the patch took effect (at the first patched call)


class PeerMismatchError(RuntimeError):
    """No assigner of the installed peer gives lucid-assign's results under any rule set: patch() has nothing to
    patch."""


FallbackWarning = api.FallbackWarning  # a patched assigner hands a call its kernel cannot take to the peer's own

def _verbose(msg: str) -> None:
    if os.environ.get(VERBOSE_ENV, "0") not in ("", "0"):
        rank = os.environ.get("RANK")
        where = f"rank {rank}, " if rank is not None else ""
        print(f"lucid-assign [{where}pid {os.getpid()}]: {msg}", file=sys.stderr, flush=True)


def _first_module(names):
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


class _Peer(types.SimpleNamespace):
    """The installed peer: version, its assigner module (tal), the modules whose losses build assigners (losses)
    and the module that writes multi-GPU scripts (dist, or None)."""


def _peer() -> _Peer:
    try:
        import ultralytics
    except ImportError as exc:
        raise ImportError(
            "lucid_assign.integrations.ultralytics needs the ultralytics package "
            f"(pip install 'lucid-assign[ultralytics]', or ultralytics{TESTED_RANGE})"
        ) from exc
    version = getattr(ultralytics, "__version__", "unknown")
    tal = _first_module(_TAL_MODULES)
    if tal is None:
        raise RuntimeError(f"ultralytics {version} has no assigner module ({' or '.join(_TAL_MODULES)}): nothing "
                           "to patch")
    losses = []
    for name in _LOSS_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if any(isinstance(getattr(module, n, None), type) for n in _NAMES):
            losses.append(module)
    return _Peer(version=version, tal=tal, losses=losses, dist=_first_module(_DIST_MODULES))


# --- the patched classes -------------------------------------------------------------------------------------------


class _Patched:
    """lucid-assign's assigner inside the peer's loss (module-level, so that a pickled model refers to it by name)."""

    peer_name = ""

    def __init__(self, *args, **kwargs):
        """The peer's constructor of the patched release (8.0 to 8.3: no ``stride`` or ``topk2``, ``eps`` fifth),
        with the rule set that patch() found for it."""
        ours = {"backend": kwargs.pop("backend", _backend),
                "rules": kwargs.pop("rules", _rules.get(self.peer_name, reference.DEFAULT_RULES))}
        peer_cls = _peer_class(self.peer_name)
        if peer_cls is not None:
            bound = inspect.signature(peer_cls.__init__).bind(None, *args, **kwargs).arguments
            bound.pop(next(iter(bound)))  # self
            bound.update(bound.pop("kwargs", {}))
            args, kwargs = (), bound
        super().__init__(*args, **kwargs, **ours)
        self.__dict__["_peer_assigner"] = None  # not a submodule: it is a fallback, not part of the model
        self.__dict__["_first_call"] = True

    def _peer_args(self) -> tuple:
        return ()

    def peer(self):
        """The peer's own assigner with the same settings (built on first use)."""
        if self._peer_assigner is None:
            cls = _peer_class(self.peer_name) or getattr(_peer().tal, self.peer_name)
            settings = dict(topk=self.topk, num_classes=self.num_classes, alpha=self.alpha, beta=self.beta,
                            stride=self.stride, eps=self.eps, topk2=self.topk2)
            self.__dict__["_peer_assigner"] = cls(*self._peer_args(), **_accepted(cls, settings))
        return self._peer_assigner

    def forward(self, pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt, **extra):
        box = (pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt)
        if extra:  # keypoint or mask overlaps: not a box assignment
            return self.peer()(*box, **extra)
        return self._run(box, (), lambda: self.peer()(*box))

    @torch.no_grad()
    def _run(self, box: tuple, extra: tuple, peer_call):
        """The call on lucid-assign's backend, or on the peer's own assigner (``peer_call()``) when under "auto" the
        kernel cannot take it, said once."""
        fell = []

        def to_peer(why):
            fell.append(why)
            _say_once(f"lucid-assign: the patched {self.peer_name} cannot run its kernel here ({why}), so these calls "
                      f"go to ultralytics' own assigner, at its speed. Fix: {api.kernel_fix(box[0].device.type, why)}"
                      f"; or patch(backend='kernel') to make this an error")
            return "peer"

        out = self._assign(box, extra, on_unsupported=to_peer)
        if fell:
            out = peer_call()
        if self._first_call:
            self._note_first_call(box[0], fell[0] if fell else None)
        return out

    def _note_first_call(self, pd_scores, ran) -> None:
        if self._first_call:
            self.__dict__["_first_call"] = False
            device = pd_scores.device if isinstance(pd_scores, torch.Tensor) else "?"
            what = f"the peer's own assigner ({ran})" if ran else f"lucid-assign's {self._effective_backend()}"
            _verbose(f"{type(self).__name__}(topk={self.topk}, topk2={self.topk2}) ran {what} on {device}")
            _announce(f"{self.peer_name} ran {what} on {device}")

    def _effective_backend(self) -> str:
        backend = os.environ.get(api.ENV_BACKEND) or self.backend
        return "kernel" if backend == "auto" else backend  # "auto" reached here means the kernel could run

def _peer_class(name: str):
    """The peer's class that patch() replaced by the patched class of ``name``, or None when not patched."""
    for (_, attr), obj in (_originals or {}).items():
        if attr == name:
            return obj
    return None


def _accepted(cls, settings: dict) -> dict:
    """Of ``settings``, those the constructor of the peer's ``cls`` takes (8.0 to 8.3: no stride or topk2)."""
    params = inspect.signature(cls.__init__).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()) and cls.__init__ is not object.__init__:
        base = next((c for c in cls.__mro__[1:] if "topk" in inspect.signature(c.__init__).parameters), None)
        params = {**params, **(inspect.signature(base.__init__).parameters if base else {})}
    return {k: v for k, v in settings.items() if k in params}


class LucidTaskAlignedAssigner(_Patched, _ours.TaskAlignedAssigner):
    """``ultralytics.utils.loss.TaskAlignedAssigner`` while patched."""

    peer_name = "TaskAlignedAssigner"


class LucidRotatedTaskAlignedAssigner(_Patched, _ours.RotatedTaskAlignedAssigner):
    """``ultralytics.utils.loss.RotatedTaskAlignedAssigner`` while patched."""

    peer_name = "RotatedTaskAlignedAssigner"


class LucidPoseTaskAlignedAssigner(_Patched, _ours.PoseTaskAlignedAssigner):
    """``ultralytics.utils.loss.PoseTaskAlignedAssigner`` while patched."""

    peer_name = "PoseTaskAlignedAssigner"

    def _peer_args(self) -> tuple:
        return (self.sigmas,)

    def forward(self, pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt, anc_strides, **extra):
        box = (pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt)
        if set(extra) != {"pd_kpts", "gt_kpts"}:  # not the peer's pose loss: the peer's class says what it makes of it
            return self.peer()(*box, anc_strides, **extra)
        pose = (anc_strides, extra["pd_kpts"], extra["gt_kpts"], self.sigmas)
        return self._run(box, pose, lambda: self.peer()(*box, anc_strides, **extra))


class LucidSegTaskAlignedAssigner(_Patched, _ours.SegTaskAlignedAssigner):
    """``ultralytics.utils.loss.SegTaskAlignedAssigner`` while patched."""

    peer_name = "SegTaskAlignedAssigner"

    def forward(self, pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt, **extra):
        box = (pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt)
        if extra.keys() != _SEG_KEYS:  # not the peer's segmentation loss: the peer's class says what it makes of it
            return self.peer()(*box, **extra)
        return self._run(box, tuple(extra[k] for k in SEG_INPUTS), lambda: self.peer()(*box, **extra))


_PATCHED = {"TaskAlignedAssigner": LucidTaskAlignedAssigner,
            "RotatedTaskAlignedAssigner": LucidRotatedTaskAlignedAssigner,
            "PoseTaskAlignedAssigner": LucidPoseTaskAlignedAssigner,
            "SegTaskAlignedAssigner": LucidSegTaskAlignedAssigner}


def _announce(first_call: str) -> None:
    """Say once per process, through the peer's logger (so that its verbosity settings apply), that the patch took
    effect: lucid-assign's version, and what the first patched call ran where."""
    global _announced
    if _announced:
        return
    _announced = True
    _logger().info(f"lucid-assign {__version__}: ultralytics' assigners are patched; the first call: {first_call}")


def _logger():
    """The peer's LOGGER (ultralytics.utils, or ultralytics.yolo.utils in early releases)."""
    module = _first_module(("ultralytics.utils", "ultralytics.yolo.utils"))
    return module.LOGGER


def effective_backend() -> str:
    """The backend the patched assigners run with: LUCID_ASSIGN_BACKEND when set, else patch()'s argument."""
    return os.environ.get(api.ENV_BACKEND) or _backend


def _say_once(msg: str) -> None:
    if msg not in _said:
        _said.add(msg)
        api.warn_caller(msg, FallbackWarning)


# --- the self-check against the installed peer ---------------------------------------------------------------------


def _topk_lower_index(input, k, dim=-1, largest=True, sorted=True):
    """torch.topk with ties to the lower index (CUDA's order and the contract's rule; the CPU's own order differs)."""
    order = torch.sort(input, dim=dim, descending=largest, stable=True)
    return torch.return_types.topk((order.values.narrow(dim, 0, k), order.indices.narrow(dim, 0, k)))


class _TiesLow(TorchFunctionMode):
    """torch.topk and Tensor.topk with ties to the lower index, in the thread that enters it and only there (torch
    function modes are thread-local): the peer's assigner runs under it during the self-check, and no other code, in
    this thread or another, sees a changed top-k."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.topk or func is torch.Tensor.topk:
            func = _topk_lower_index
        return func(*args, **(kwargs or {}))


def _check_batches():
    """The built-in check batches (synthetic.check_batch: every rare rule of the contract), HBB and OBB, with the
    settings of the peer's losses (top-k 10; YOLO26's one-to-one assignment, top-k 7 with top-k2 1)."""
    for name, obb in (("TaskAlignedAssigner", False), ("RotatedTaskAlignedAssigner", True)):
        batch = check_batch(obb)
        inputs = [batch[k] for k in INPUTS]
        for topk, topk2 in ((10, None), (7, 1)):
            yield name, inputs, dict(topk=topk, topk2=topk2, num_classes=5, alpha=0.5, beta=6.0,
                                     stride=batch["stride"])


def _pose_check_batches():
    """The built-in pose check batch (synthetic.pose_batch: objects at every level and at the gate's edges, thin
    objects the gate would starve, invisible keypoints), with the settings of the peer's pose losses."""
    batch = pose_batch(batch=2, img_size=128, num_classes=5, objects=(6, 16), seed=3)
    inputs = [batch[k] for k in (*INPUTS, "anc_strides")]
    kpts = dict(pd_kpts=batch["pd_kpts"], gt_kpts=batch["gt_kpts"])
    for topk, topk2 in ((10, None), (7, 1)):
        kw = dict(topk=topk, topk2=topk2, num_classes=5, alpha=0.5, beta=6.0, stride=batch["stride"])
        yield inputs, kpts, batch["sigmas"], kw


def _seg_check_batches():
    """The built-in segmentation check batch (synthetic.seg_batch: overlapping, empty and box-filling masks, empty
    predicted masks), with the settings of the peer's segmentation losses."""
    batch = seg_batch(batch=2, img_size=128, num_classes=5, objects=(6, 16), mask_dim=8, seed=3)
    inputs = [batch[k] for k in INPUTS]
    masks = {k: batch[k] for k in SEG_INPUTS}
    for topk, topk2 in ((10, None), (7, 1)):
        yield inputs, masks, dict(topk=topk, topk2=topk2, num_classes=5, alpha=0.5, beta=6.0, stride=batch["stride"])


def _runs(tal, name):
    """(settings, our reference for a rule set, the peer's outputs) of the built-in batches for the peer's class
    ``name``, the peer run on the CPU with ties to the lower index."""
    cls = getattr(tal, name)
    takes_topk2 = _takes_topk2(cls)
    if name == "PoseTaskAlignedAssigner":
        batches = [(inputs, dict(kpts, sigmas=sigmas), kw) for inputs, kpts, sigmas, kw in _pose_check_batches()]
    elif name == "SegTaskAlignedAssigner":
        batches = list(_seg_check_batches())
    else:
        batches = [(inputs, {}, kw) for n, inputs, kw in _check_batches() if n == name]
    for inputs, extra, kw in batches:
        if kw["topk2"] is not None and not takes_topk2:
            continue
        extra = dict(extra)
        sigmas = extra.pop("sigmas", None)
        peer = cls(*(() if sigmas is None else (sigmas,)), **_accepted(cls, kw))
        args = inputs
        if sigmas is not None and "anc_strides" not in inspect.signature(cls.forward).parameters:
            args = inputs[:-1]  # releases before 8.4.187 take no strides (and have no level gate)
        with torch.no_grad(), _TiesLow():  # on copies: a release that modifies its inputs differs
            theirs = peer(*(t.clone() for t in args), **{k: v.clone() for k, v in extra.items()})

        def ours(rules, dense, inputs=inputs, extra=extra, sigmas=sigmas, kw=kw):
            kw = dict(kw, rules=rules, dense_metrics=dense)
            if name == "PoseTaskAlignedAssigner":
                return reference.assign_pose(*inputs, extra["pd_kpts"], extra["gt_kpts"], sigmas, **kw)
            if name == "SegTaskAlignedAssigner":
                return reference.assign_seg(*inputs, *extra.values(), **kw)
            return reference.assign(*inputs, **kw)

        yield kw, ours, theirs


def _takes_topk2(cls) -> bool:
    """Whether the peer's class has the second top-k (8.4 and later); 8.0 to 8.3 have none."""
    return "topk2" in _accepted(cls, {"topk2": 1})


def _first_difference(kw, ours, theirs) -> str | None:
    names = ("target_labels", "target_bboxes", "target_scores", "fg_mask", "target_gt_idx")
    for out, a, b in zip(names, ours, theirs):
        if a.shape != b.shape or not torch.equal(a.to(b.dtype), b):
            count = int((a.to(b.dtype) != b).sum()) if a.shape == b.shape else "shape"
            return f"topk={kw['topk']}, topk2={kw['topk2']}: {out} differs ({count} elements)"
    return None


def check_peer(tal=None) -> dict:
    """For each assigner class of the peer's module ``tal``: ``(rules, detail)``, the first rule set
    (reference.RULE_SETS; the default first, then the newest) under which lucid-assign's reference gives the class's
    outputs bit for bit on the built-in batches (the CPU, ties to the lower index), or ``(None, why)`` when none does.
    Classes the release lacks are absent."""
    if tal is None:
        tal = _peer().tal
    found = {}
    for name in _NAMES:
        if not isinstance(getattr(tal, name, None), type):
            continue
        try:
            runs = list(_runs(tal, name))
        except Exception as exc:  # a release whose class cannot run the built-in batch is left to itself
            found[name] = None, f"its check raised {type(exc).__name__}: {exc}"
            continue
        # the default first, then the others newest first; 8.0 only, and first, for a class without the top-k2
        # of later releases
        newer = [reference.DEFAULT_RULES,
                 *(r for r in reversed(reference.RULE_SETS) if r not in ("8.0", reference.DEFAULT_RULES))]
        first = None
        for rules, dense in itertools.product(newer if _takes_topk2(getattr(tal, name)) else ["8.0", *newer],
                                              (False, True)):
            diff = next(filter(None, (_first_difference(kw, ours(rules, dense), theirs)
                                      for kw, ours, theirs in runs)), None)
            if diff is None:
                found[name] = rules, f"rule set {rules}"
                break
            first = first or f"{diff} under rule set {rules}"
        else:
            found[name] = None, f"no rule set gives its results ({first})"
    return found


def self_check(tal=None) -> str | None:
    """None when every assigner class of the peer's module ``tal`` (default: the installed peer's) gives the results
    of lucid-assign's reference under one of its rule sets on the built-in batches, else what differs."""
    bad = [f"{name}: {why}" for name, (rules, why) in check_peer(tal).items() if rules is None]
    return "; ".join(bad) or None


# --- multi-GPU: every rank the peer launches patches itself ---------------------------------------------------------

_RANK_PREAMBLE = """\
# lucid-assign: this rank builds lucid-assign's assigners, as the process that launched it did
import sys as _lucid_sys
_lucid_sys.path[:0] = [_p for _p in {paths!r} if _p not in _lucid_sys.path]
from lucid_assign.integrations import ultralytics as _lucid_ultralytics
_lucid_ultralytics.patch({backend!r})
del _lucid_sys, _lucid_ultralytics
"""


def _rank_patched(generate_ddp_file):
    """The peer's generate_ddp_file, with the script it writes made to patch its rank first."""

    def generate_ddp_file_patched(trainer):
        path = generate_ddp_file(trainer)
        with open(path, encoding="utf-8") as f:
            script = f.read()
        package_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        script = _RANK_PREAMBLE.format(paths=[package_parent], backend=_backend) + script
        compile(script, path, "exec")  # the peer's script must still be a script (no __future__ import to keep first)
        with open(path, "w", encoding="utf-8") as f:
            f.write(script)
        return path

    generate_ddp_file_patched.__wrapped__ = generate_ddp_file
    generate_ddp_file_patched.__doc__ = generate_ddp_file.__doc__
    return generate_ddp_file_patched


# --- patch / unpatch -----------------------------------------------------------------------------------------------


def patch(backend: str = "auto") -> None:
    """Make the peer's losses (detection, OBB, pose and segmentation, YOLO26's end-to-end loss), in this process and
    in the ranks of a multi-GPU run it launches, build lucid-assign's assigners. Calling it again is harmless (the
    latest ``backend`` applies).

    Each assigner class of the installed release is checked on the built-in batches (check_peer) and patched with the
    rule set that reproduces it; one that no rule set reproduces is left to the peer, said once with the reason (a
    FallbackWarning); a class the release lacks is not a concern. Raises ``PeerMismatchError`` when no class of the
    release is reproduced (nothing to patch), and ``RuntimeError`` for ``backend="kernel"`` when the compiled library
    is not loaded."""
    global _originals, _backend, _rules, _left
    if backend not in api.BACKENDS:
        raise ValueError(f"backend must be one of {api.BACKENDS}, got {backend!r}")
    peer = _peer()
    if _originals is None:
        found = check_peer(peer.tal)
        rules = {name: r for name, (r, _) in found.items() if r is not None}
        if not rules:
            raise PeerMismatchError(
                f"ultralytics {peer.version} assigns differently from lucid-assign under every rule set on its "
                f"built-in batches ({'; '.join(f'{n}: {why}' for n, (_, why) in found.items())}), so patch() has "
                f"nothing to patch: train unpatched, or install ultralytics{TESTED_RANGE}")
    if backend == "kernel" and not _library.loaded():
        raise RuntimeError(f"patch(backend='kernel'): the compiled library is not loaded ({_library.LOAD_ERROR}). "
                           f"Fix: {_library.LOAD_FIX}")
    if backend == "auto" and not _library.loaded():
        _say_once(f"lucid-assign: the compiled library is not loaded ({_library.LOAD_ERROR}), so the patched "
                  f"assigners hand every call to ultralytics' own assigner, at its speed. Fix: {_library.LOAD_FIX}")
    if _originals is None:
        _rules = rules
        _left = {name: why for name, (r, why) in found.items() if r is None}
        _originals = {(m.__name__, n): getattr(m, n) for m in peer.losses for n in rules if hasattr(m, n)}
        if callable(getattr(peer.dist, "generate_ddp_file", None)):
            _originals[(peer.dist.__name__, "generate_ddp_file")] = peer.dist.generate_ddp_file
        for name, why in _left.items():
            _say_once(f"lucid-assign: ultralytics {peer.version}'s {name} is left to ultralytics ({why}); its other "
                      f"assigners are patched")
    _backend = backend
    for (module, name), original in _originals.items():
        setattr(sys.modules[module], name, _rank_patched(original) if name == "generate_ddp_file" else _PATCHED[name])
    _verbose(f"patched ultralytics {peer.version} (backend {effective_backend()!r}): "
             f"{', '.join(f'{n} with rules {r}' for n, r in _rules.items())}")


def patch_report() -> list:
    """What patch() did with each assigner of the installed release: lines "NAME: patched (rule set R)" or
    "NAME: left to ultralytics (why)". Empty when not patched."""
    return ([f"{name}: patched (rule set {rules})" for name, rules in _rules.items()] +
            [f"{name}: left to ultralytics ({why})" for name, why in _left.items()]) if _originals is not None else []


def unpatch() -> None:
    """Restore the peer exactly as it was. Harmless when not patched."""
    global _originals, _rules, _left
    if _originals is None:
        return
    for (module, name), original in _originals.items():
        setattr(sys.modules[module], name, original)
    _originals, _rules, _left = None, {}, {}


def is_patched() -> bool:
    """True while patch() is in effect (between patch() and unpatch())."""
    return _originals is not None


@contextlib.contextmanager
def patched(backend: str = "auto"):
    """``with patched(): ...`` patches for the block; leaving it restores exactly the state before it: the peer
    unpatched, or patched with the backend it had."""
    global _backend
    was, before = is_patched(), _backend
    patch(backend)
    try:
        yield
    finally:
        if was:
            _backend = before
        else:
            unpatch()
