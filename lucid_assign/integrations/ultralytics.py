"""Make the peer trainer's (ultralytics) detection, OBB, pose and segmentation losses use lucid-assign's assigners.

    from lucid_assign.integrations import ultralytics as lucid_ultralytics
    lucid_ultralytics.patch()      # before the trainer builds its loss (the first training step)

What changes: the names ``TaskAlignedAssigner``, ``RotatedTaskAlignedAssigner``, ``PoseTaskAlignedAssigner`` and
``SegTaskAlignedAssigner`` of ``ultralytics.utils.loss``, which ``v8DetectionLoss``, ``v8OBBLoss``, ``PoseLoss26``,
``SegmentLoss26`` and ``E2ELoss`` (YOLO26: one assignment with top-k 10 and one with top-k 7 and top-k2 1)
instantiate, become ``LucidTaskAlignedAssigner``, ``LucidRotatedTaskAlignedAssigner``, ``LucidPoseTaskAlignedAssigner``
and ``LucidSegTaskAlignedAssigner``. Losses built before ``patch()`` keep the
assigner they have. The speed and memory of the assignment change; its results do not.

- Multi-GPU: the peer trains on several GPUs by writing a script that ``torch.distributed.run`` starts once per GPU;
  those processes import the peer afresh. While patched, every such script first patches its own process with the
  same backend, so every rank builds lucid-assign's assigners.
- The command line: ``lucid-assign yolo ARGS`` runs the peer's ``yolo ARGS`` patched (lucid_assign.__main__).
- No silent slowdown: with ``backend="auto"``, a call the kernel cannot take (library not loaded, no CUDA kernels
  built, a dtype it lacks) is handed to the peer's own assigner, so training runs at the peer's speed, and that is
  said once per reason, with the fix, as a ``FallbackWarning``. ``backend="kernel"`` raises instead;
  ``backend="reference"`` runs lucid-assign's pure-PyTorch reference.
- No silent divergence: ``patch()`` runs the installed peer's assigners and lucid-assign's on a small built-in batch
  (on the CPU, ties to the lower index) and refuses, with ``PeerMismatchError``, when they differ. Exactness was
  shown for ultralytics 8.4.190; the other 8.4.x releases are accepted when they pass this check.
- ``LUCID_ASSIGN_VERBOSE=1`` prints, per process, when it is patched and what each patched assigner's first call ran
  (evidence that every rank of a multi-GPU run uses the kernel).

Left on the peer's code, on purpose: any call that passes other extra inputs to a patched assigner is handed to the
peer's class.

Nothing is imported from ultralytics until ``patch()`` is called; a missing package or a version whose assigner
interface differs gives a clear error.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
import types

import torch

from .. import __version__, _library, api, reference
from .. import assigner as _ours
from ..synthetic import check_batch, pose_batch, seg_batch

SUPPORTED_VERSIONS = ("8.4.",)  # versions whose assigner interface and loss wiring were checked
VERIFIED_VERSION = "8.4.190"  # the version the kernels were shown bit-exact against
_NAMES = ("TaskAlignedAssigner", "RotatedTaskAlignedAssigner", "PoseTaskAlignedAssigner", "SegTaskAlignedAssigner")
_SEG_INPUTS = ("pd_coef", "mask_scale", "proto", "gt_masks")
_SEG_KEYS = frozenset(_SEG_INPUTS)
_EXPECTED_ARGS = ("topk", "num_classes", "alpha", "beta", "stride", "eps", "topk2")
VERBOSE_ENV = "LUCID_ASSIGN_VERBOSE"

_originals: dict | None = None  # the peer's objects that patch() replaced, by name
_backend = "auto"  # the backend of the current patch
_said: set = set()
_announced = False  # whether this process said that the patch took effect (at the first patched call)


class PeerMismatchError(RuntimeError):
    """The installed peer's assigner gives other results than lucid-assign: patch() refuses."""


FallbackWarning = api.FallbackWarning  # a patched assigner hands a call its kernel cannot take to the peer's own

def _verbose(msg: str) -> None:
    if os.environ.get(VERBOSE_ENV, "0") not in ("", "0"):
        rank = os.environ.get("RANK")
        where = f"rank {rank}, " if rank is not None else ""
        print(f"lucid-assign [{where}pid {os.getpid()}]: {msg}", file=sys.stderr, flush=True)


def _peer():
    try:
        import ultralytics
        from ultralytics.utils import dist, loss, tal
    except ImportError as exc:
        raise ImportError(
            "lucid_assign.integrations.ultralytics needs the ultralytics package "
            f"(pip install 'lucid-assign[ultralytics]', or ultralytics=={VERIFIED_VERSION})"
        ) from exc
    version = getattr(ultralytics, "__version__", "unknown")
    if not version.startswith(SUPPORTED_VERSIONS):
        raise RuntimeError(
            f"ultralytics {version} is not a version whose assigners lucid-assign was checked against "
            f"({', '.join(v + 'x' for v in SUPPORTED_VERSIONS)}; exact for {VERIFIED_VERSION})"
        )
    for name in _NAMES:
        if getattr(loss, name, None) is None:
            raise RuntimeError(f"ultralytics {version}: ultralytics.utils.loss has no {name}; cannot patch")
        cls = getattr(tal, name)
        if name == "PoseTaskAlignedAssigner":  # sigmas, then the base class's arguments; the strides to forward()
            expected = ("sigmas",)
            ok = issubclass(cls, tal.TaskAlignedAssigner) and "anc_strides" in inspect.signature(cls.forward).parameters
        elif name == "SegTaskAlignedAssigner":  # the base class's arguments; the mask inputs to pair_overlaps
            expected = _EXPECTED_ARGS
            ok = issubclass(cls, tal.TaskAlignedAssigner) and set(_SEG_INPUTS) <= set(
                inspect.signature(cls.pair_overlaps).parameters)
        else:
            expected, ok = _EXPECTED_ARGS, True
        params = inspect.signature(cls.__init__).parameters
        missing = [p for p in expected if p not in params]
        if missing or not ok:
            raise RuntimeError(f"ultralytics {version}: {name} lacks the arguments {missing or 'it takes'}; "
                               "cannot patch")
    if not callable(getattr(dist, "generate_ddp_file", None)):
        raise RuntimeError(f"ultralytics {version}: ultralytics.utils.dist has no generate_ddp_file; cannot patch "
                           "its multi-GPU launch")
    return version, loss, tal, dist


# --- the patched classes -------------------------------------------------------------------------------------------


class _Patched:
    """lucid-assign's assigner inside the peer's loss (module-level, so that a pickled model refers to it by name)."""

    peer_name = ""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("backend", _backend)
        super().__init__(*args, **kwargs)
        self.__dict__["_peer_assigner"] = None  # not a submodule: it is a fallback, not part of the model
        self.__dict__["_first_call"] = True

    def _peer_args(self) -> tuple:
        return ()

    def peer(self):
        """The peer's own assigner with the same settings (built on first use)."""
        if self._peer_assigner is None:
            cls = (_originals or {}).get(self.peer_name) or getattr(sys.modules["ultralytics.utils.tal"],
                                                                    self.peer_name)
            self.__dict__["_peer_assigner"] = cls(*self._peer_args(), topk=self.topk, num_classes=self.num_classes,
                                                  alpha=self.alpha, beta=self.beta, stride=self.stride, eps=self.eps,
                                                  topk2=self.topk2)
        return self._peer_assigner

    def forward(self, pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt, **extra):
        if extra:  # keypoint or mask overlaps: not a box assignment
            return self.peer()(pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt, **extra)
        ran = self._fallback_reason(pd_scores, pd_bboxes, anc_points, gt_bboxes)
        if ran is not None:
            out = self.peer()(pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt)
        else:
            out = super().forward(pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt)
        self._note_first_call(pd_scores, ran)
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

    def _fallback_reason(self, pd_scores, pd_bboxes, anc_points, gt_bboxes, pose=None, seg=None) -> str | None:
        """Why this call goes to the peer (backend "auto" and the kernel cannot take these tensors), or None.
        ``pose``: the pose tensors (anc_strides, pd_kpts, gt_kpts, sigmas); ``seg``: the mask tensors (pd_coef,
        mask_scale, proto, gt_masks)."""
        if (os.environ.get(api.ENV_BACKEND) or self.backend) != "auto":
            return None
        extra = (*(pose or ()), *(seg or ()))
        if not all(isinstance(t, torch.Tensor) for t in (pd_scores, pd_bboxes, anc_points, gt_bboxes, *extra)):
            return None  # the module's checks name the argument
        why = api.kernel_unsupported(pd_scores, pd_bboxes, anc_points, gt_bboxes)
        if why is None and pose is not None and pose[2].dim() == 4:
            why = api.extra_unsupported(pd_scores.device.type, gt_bboxes.dtype, api._pose_key(*pose))
        if why is None and seg is not None:
            why = api.extra_unsupported(pd_scores.device.type, gt_bboxes.dtype, api._seg_key(*seg))
        if why is not None:
            _say_once(f"lucid-assign: the patched {self.peer_name} cannot run its kernel here ({why}), so these calls "
                      f"go to ultralytics' own assigner, at its speed. Fix: "
                      f"{api.kernel_fix(pd_scores.device.type, why)}; or patch(backend='kernel') to make this an "
                      f"error")
        return why


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
        args = (pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt, anc_strides)
        if set(extra) != {"pd_kpts", "gt_kpts"}:  # not the peer's pose loss: the peer's class says what it makes of it
            return self.peer()(*args, **extra)
        pose = (anc_strides, extra["pd_kpts"], extra["gt_kpts"], self.sigmas)
        ran = self._fallback_reason(pd_scores, pd_bboxes, anc_points, gt_bboxes, pose)
        if ran is not None:
            out = self.peer()(*args, **extra)
        else:
            out = _ours.PoseTaskAlignedAssigner.forward(self, *args, **extra)
        self._note_first_call(pd_scores, ran)
        return out


class LucidSegTaskAlignedAssigner(_Patched, _ours.SegTaskAlignedAssigner):
    """``ultralytics.utils.loss.SegTaskAlignedAssigner`` while patched."""

    peer_name = "SegTaskAlignedAssigner"

    def forward(self, pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt, **extra):
        if extra.keys() != _SEG_KEYS:  # not the peer's segmentation loss: the peer's class says what it makes of it
            return self.peer()(pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt, **extra)
        # a signature that ran the kernel before runs it again (its host time is a share of the step: the checks and
        # the choice of backend are asked once per signature; the op's outputs never require grad)
        out = api.seg_kernel_call(pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt, extra["pd_coef"],
                                  extra["mask_scale"], extra["proto"], extra["gt_masks"], topk=self.topk,
                                  num_classes=self.num_classes, alpha=self.alpha, beta=self.beta, eps=self.eps,
                                  stride=self.stride, topk2=self.topk2, backend=self.backend)
        if out is not None:
            if self._first_call:
                self._note_first_call(pd_scores, None)
            return out
        args = (pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt)
        seg = tuple(extra[k] for k in _SEG_INPUTS)
        ran = self._fallback_reason(pd_scores, pd_bboxes, anc_points, gt_bboxes, seg=seg)
        if ran is not None:
            out = self.peer()(*args, **extra)
        else:
            out = _ours.SegTaskAlignedAssigner.forward(self, *args, *seg)
        self._note_first_call(pd_scores, ran)
        return out


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
    from ultralytics.utils import LOGGER

    LOGGER.info(f"lucid-assign {__version__}: ultralytics' assigners are patched; the first call: {first_call}")


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


class _TorchTiesLow(types.ModuleType):
    """torch, but for topk: given to the peer's assigner module alone, during the self-check."""

    def __init__(self):
        super().__init__("torch")

    def __getattr__(self, name):
        return getattr(torch, name)

    topk = staticmethod(_topk_lower_index)


def _check_batches():
    """The built-in check batches (synthetic.check_batch: every rare rule of the contract), HBB and OBB, with the
    settings of the peer's losses (top-k 10; YOLO26's one-to-one assignment, top-k 7 with top-k2 1)."""
    for name, obb in (("TaskAlignedAssigner", False), ("RotatedTaskAlignedAssigner", True)):
        batch = check_batch(obb)
        inputs = [batch[k] for k in ("pd_scores", "pd_bboxes", "anc_points", "gt_labels", "gt_bboxes", "mask_gt")]
        for topk, topk2 in ((10, None), (7, 1)):
            yield name, inputs, dict(topk=topk, topk2=topk2, num_classes=5, alpha=0.5, beta=6.0,
                                     stride=batch["stride"])


def _pose_check_batches():
    """The built-in pose check batch (synthetic.pose_batch: objects at every level and at the gate's edges, thin
    objects the gate would starve, invisible keypoints), with the settings of the peer's pose losses."""
    batch = pose_batch(batch=2, img_size=128, num_classes=5, objects=(6, 16), seed=3)
    inputs = [batch[k] for k in ("pd_scores", "pd_bboxes", "anc_points", "gt_labels", "gt_bboxes", "mask_gt",
                                 "anc_strides")]
    kpts = dict(pd_kpts=batch["pd_kpts"], gt_kpts=batch["gt_kpts"])
    for topk, topk2 in ((10, None), (7, 1)):
        kw = dict(topk=topk, topk2=topk2, num_classes=5, alpha=0.5, beta=6.0, stride=batch["stride"])
        yield inputs, kpts, batch["sigmas"], kw


def _seg_check_batches():
    """The built-in segmentation check batch (synthetic.seg_batch: overlapping, empty and box-filling masks, empty
    predicted masks), with the settings of the peer's segmentation losses."""
    batch = seg_batch(batch=2, img_size=128, num_classes=5, objects=(6, 16), mask_dim=8, seed=3)
    inputs = [batch[k] for k in ("pd_scores", "pd_bboxes", "anc_points", "gt_labels", "gt_bboxes", "mask_gt")]
    masks = {k: batch[k] for k in _SEG_INPUTS}
    for topk, topk2 in ((10, None), (7, 1)):
        yield inputs, masks, dict(topk=topk, topk2=topk2, num_classes=5, alpha=0.5, beta=6.0, stride=batch["stride"])


@contextlib.contextmanager
def _tensor_topk_ties_low():
    """Tensor.topk with ties to the lower index, for the block (the peer's segmentation assigner calls the method)."""
    saved = torch.Tensor.topk
    torch.Tensor.topk = lambda self, *args, **kwargs: _topk_lower_index(self, *args, **kwargs)
    try:
        yield
    finally:
        torch.Tensor.topk = saved


def self_check(tal=None) -> str | None:
    """Run the peer's assigners (module ``tal``) and lucid-assign's reference on the built-in batches on the CPU,
    ties to the lower index; return None when every output is equal bit for bit, else what differs."""
    if tal is None:
        from ultralytics.utils import tal
    names = ("target_labels", "target_bboxes", "target_scores", "fg_mask", "target_gt_idx")
    saved = tal.torch
    tal.torch = _TorchTiesLow()

    def pose_runs():
        for inputs, kpts, sigmas, kw in _pose_check_batches():
            with torch.no_grad():
                theirs = tal.PoseTaskAlignedAssigner(sigmas, **kw)(*inputs, **kpts)
            ours = reference.assign_pose(*inputs, kpts["pd_kpts"], kpts["gt_kpts"], sigmas, **kw)
            yield "PoseTaskAlignedAssigner", kw, ours, theirs

    def seg_runs():
        for inputs, masks, kw in _seg_check_batches():
            with torch.no_grad(), _tensor_topk_ties_low():
                theirs = tal.SegTaskAlignedAssigner(**kw)(*inputs, **masks)
            ours = reference.assign_seg(*inputs, *masks.values(), **kw)
            yield "SegTaskAlignedAssigner", kw, ours, theirs

    def box_runs():
        for name, inputs, kw in _check_batches():
            peer = getattr(tal, name)(**kw)
            with torch.no_grad():
                theirs = peer(*inputs)
            yield name, kw, reference.assign(*inputs, **kw), theirs

    try:
        for name, kw, ours, theirs in (*box_runs(), *pose_runs(), *seg_runs()):
            for out, a, b in zip(names, ours, theirs):
                if a.shape != b.shape or not torch.equal(a.to(b.dtype), b):
                    return (f"{name}(topk={kw['topk']}, topk2={kw['topk2']}): {out} differs "
                            f"({int((a.to(b.dtype) != b).sum()) if a.shape == b.shape else 'shape'} elements)")
    finally:
        tal.torch = saved
    return None


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
    """Make the peer's detection, OBB, pose and segmentation losses, in this process and in the ranks of a multi-GPU
    run it launches, build lucid-assign's assigners. Calling it again is harmless (the latest ``backend`` applies).

    Raises ``PeerMismatchError`` when the installed peer's assigners give other results than lucid-assign's on the
    built-in check batch, and ``RuntimeError`` for ``backend="kernel"`` when the compiled library is not loaded."""
    global _originals, _backend
    if backend not in api.BACKENDS:
        raise ValueError(f"backend must be one of {api.BACKENDS}, got {backend!r}")
    version, loss, tal, dist = _peer()
    if _originals is None:
        diff = self_check(tal)
        if diff is not None:
            raise PeerMismatchError(
                f"ultralytics {version} assigns differently from lucid-assign on its built-in check batch ({diff}); "
                f"lucid-assign reproduces ultralytics {VERIFIED_VERSION} exactly, so patch() refuses: install "
                f"ultralytics=={VERIFIED_VERSION}, or train unpatched")
    if backend == "kernel" and not _library.loaded():
        raise RuntimeError(f"patch(backend='kernel'): the compiled library is not loaded ({_library.LOAD_ERROR}). "
                           f"Fix: {_library.LOAD_FIX}")
    if backend == "auto" and not _library.loaded():
        _say_once(f"lucid-assign: the compiled library is not loaded ({_library.LOAD_ERROR}), so the patched "
                  f"assigners hand every call to ultralytics' own assigner, at its speed. Fix: {_library.LOAD_FIX}")
    if _originals is None:
        _originals = {name: getattr(loss, name) for name in _NAMES}
        _originals["generate_ddp_file"] = dist.generate_ddp_file
    _backend = backend
    for name in _NAMES:
        setattr(loss, name, _PATCHED[name])
    dist.generate_ddp_file = _rank_patched(_originals["generate_ddp_file"])
    _verbose(f"patched ultralytics {version} (backend {effective_backend()!r})")


def unpatch() -> None:
    """Restore the peer exactly as it was. Harmless when not patched."""
    global _originals
    if _originals is None:
        return
    from ultralytics.utils import dist, loss

    for name in _NAMES:
        setattr(loss, name, _originals[name])
    dist.generate_ddp_file = _originals["generate_ddp_file"]
    _originals = None


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
