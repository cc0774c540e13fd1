"""Make the peer trainer's (ultralytics) detection, OBB, pose and segmentation losses use lucid-assign's assigners.

    from lucid_assign.integrations import ultralytics as lucid_ultralytics
    lucid_ultralytics.patch()      # before the trainer builds its loss (the first training step)

What changes: the names ``TaskAlignedAssigner``, ``RotatedTaskAlignedAssigner``, ``PoseTaskAlignedAssigner`` and
``SegTaskAlignedAssigner`` of the peer's loss module (``ultralytics.utils.loss``; in early 8.0 releases
``ultralytics.yolo.utils.loss`` or the trainer modules), which ``v8DetectionLoss``, ``v8OBBLoss``, ``v8PoseLoss``,
``v8SegmentationLoss``, ``PoseLoss26``, ``SegmentLoss26`` and ``E2ELoss`` (YOLO26: one assignment with top-k 10 and one
with top-k 7 and top-k2 1) instantiate, become ``LucidTaskAlignedAssigner``, ``LucidRotatedTaskAlignedAssigner``,
``LucidPoseTaskAlignedAssigner`` and ``LucidSegTaskAlignedAssigner``, each with the rule set of the installed
release (docs/spec.md, "Rule sets") and that release's constructor. The RT-DETR losses' ``HungarianMatcher``
(``ultralytics.models.utils.ops`` and ``.loss``) becomes ``LucidHungarianMatcher``, which matches on the device
(ultralytics_detr.py). Losses built before ``patch()`` keep the assigner they have. The speed and memory of the
assignment change; its results do not.

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

import inspect
import os
import sys

import torch

from .. import __version__, _library, dispatch, reference
from .. import assigner as _ours
from ..reference import SEG_INPUTS
from . import _patching
from ._patching import ULTRALYTICS as STATE
from ._peer import TESTED_RANGE, accepted as _accepted, find_peer as _peer
from .ultralytics_check import check_peer, self_check
from .ultralytics_ddp import rank_patched
from .ultralytics_detr import NAME as MATCHER, LucidHungarianMatcher, Pending, check_matcher, matcher_modules

__all__ = ["FallbackWarning", "LucidHungarianMatcher", "LucidPoseTaskAlignedAssigner",
           "LucidRotatedTaskAlignedAssigner", "LucidSegTaskAlignedAssigner", "LucidTaskAlignedAssigner",
           "PeerMismatchError", "check_peer",
           "effective_backend", "is_patched", "patch", "patch_report", "patched", "self_check", "unpatch"]

_SEG_KEYS = frozenset(SEG_INPUTS)

# STATE (_patching.py): originals, (module, name) -> the peer's object that patch() replaced; backend; said once
_rules: dict = {}  # assigner name -> the rule set its patched class reproduces
_left: dict = {}  # assigner name -> why patch() left it to the peer


class PeerMismatchError(RuntimeError):
    """No assigner of the installed peer gives lucid-assign's results under any rule set: patch() has nothing to
    patch."""


FallbackWarning = dispatch.FallbackWarning  # a patched assigner hands a call its kernel cannot take to the peer's own


# --- the patched classes -------------------------------------------------------------------------------------------


class _Patched:
    """lucid-assign's assigner inside the peer's loss (module-level, so that a pickled model refers to it by name)."""

    peer_name = ""

    def __init__(self, *args, **kwargs):
        """The peer's constructor of the patched release (8.0 to 8.3: no ``stride`` or ``topk2``, ``eps`` fifth),
        with the rule set that patch() found for it."""
        ours = {"backend": kwargs.pop("backend", STATE.backend),
                "rules": kwargs.pop("rules", _rules.get(self.peer_name, reference.DEFAULT_RULES))}
        peer_cls = STATE.original(self.peer_name)
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
            cls = STATE.original(self.peer_name) or getattr(_peer().tal, self.peer_name)
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
            STATE.say_once(f"lucid-assign: the patched {self.peer_name} cannot run its kernel here ({why}), so these "
                           f"calls go to ultralytics' own assigner, at its speed. Fix: "
                           f"{dispatch.kernel_fix(box[0].device.type, why)}; or patch(backend='kernel') to make this "
                           f"an error")
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
            STATE.verbose(f"{type(self).__name__}(topk={self.topk}, topk2={self.topk2}) ran {what} on {device}")
            STATE.announce(f"{self.peer_name} ran {what} on {device}", __version__)

    def _effective_backend(self) -> str:
        backend = os.environ.get(dispatch.ENV_BACKEND) or self.backend
        return "kernel" if backend == "auto" else backend  # "auto" reached here means the kernel could run


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
            "SegTaskAlignedAssigner": LucidSegTaskAlignedAssigner,
            MATCHER: LucidHungarianMatcher}


def describe_variant(variant) -> str:
    """patch_report()'s words for the cost variant of the patched matcher."""
    parts = [f"{variant.layout} cost"] + (["widened to float32"] if variant.widen else []) + \
        (["non-finite costs to 0"] if variant.sanitize else [])
    return ", ".join(parts)


def check_matcher_of_peer():
    """(variant, why) of check_matcher for the installed peer's HungarianMatcher, or None when it has none (no RT-DETR
    in the release, or its module does not import)."""
    modules = matcher_modules()
    return check_matcher(STATE.original(MATCHER) or getattr(modules[0], MATCHER)) if modules else None


def effective_backend() -> str:
    """The backend the patched assigners run with: LUCID_ASSIGN_BACKEND when set, else patch()'s argument."""
    return STATE.effective_backend()


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
    global _rules, _left
    if backend not in dispatch.BACKENDS:
        raise ValueError(f"backend must be one of {dispatch.BACKENDS}, got {backend!r}")
    peer = _peer()
    if STATE.originals is None:
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
        STATE.say_once(f"lucid-assign: the compiled library is not loaded ({_library.LOAD_ERROR}), so the patched "
                       f"assigners hand every call to ultralytics' own assigner, at its speed. Fix: "
                       f"{_library.LOAD_FIX}")
    if STATE.originals is None:
        _rules = rules
        _left = {name: why for name, (r, why) in found.items() if r is None}
        originals = {(m.__name__, n): getattr(m, n) for m in peer.losses for n in rules if hasattr(m, n)}
        modules = matcher_modules()
        if modules:  # its check waits for the first matcher built (_settle_matcher): a YOLO fit never builds one
            LucidHungarianMatcher.variant = Pending(_settle_matcher)
            _rules[MATCHER] = "its cost variant is checked when the first one is built"
            originals.update({(m.__name__, MATCHER): getattr(m, MATCHER) for m in modules})
        if callable(getattr(peer.dist, "generate_ddp_file", None)):
            originals[(peer.dist.__name__, "generate_ddp_file")] = peer.dist.generate_ddp_file
        STATE.originals = originals
        for name, why in _left.items():
            STATE.say_once(f"lucid-assign: ultralytics {peer.version}'s {name} is left to ultralytics ({why}); its "
                           f"other assigners are patched")
    STATE.backend = LucidHungarianMatcher.backend = backend
    for (module, name), original in STATE.originals.items():
        ours = rank_patched(original, lambda: STATE.backend) if name == "generate_ddp_file" else _PATCHED[name]
        setattr(sys.modules[module], name, ours)
    STATE.verbose(f"patched ultralytics {peer.version} (backend {effective_backend()!r}): "
                  f"{', '.join(f'{n} with rules {r}' for n, r in _rules.items())}")


def _settle_matcher() -> None:
    """The check of the peer's RT-DETR matcher (check_matcher), run when the first matcher is built while patched, or
    by patch_report(): it imports SciPy and runs the peer's matcher, which costs a fit that never builds one (every
    YOLO fit) a third of a second or more at its start. The matcher is lucid-assign's from then on with the variant it
    found, or, when none reproduces the peer, the peer's again (a FallbackWarning says why)."""
    found = check_matcher_of_peer()
    variant, why = found if found is not None else (None, "its RT-DETR modules no longer import")
    LucidHungarianMatcher.variant = variant
    if variant is not None:
        _rules[MATCHER] = describe_variant(variant)
        STATE.verbose(f"HungarianMatcher: patched ({_rules[MATCHER]})")
        return
    _rules.pop(MATCHER, None)
    _left[MATCHER] = why
    for key in [key for key in STATE.originals if key[1] == MATCHER]:
        setattr(sys.modules[key[0]], MATCHER, STATE.originals.pop(key))
    STATE.say_once(f"lucid-assign: ultralytics {_peer().version}'s {MATCHER} is left to ultralytics ({why}); its "
                   f"other assigners are patched")


def patch_report() -> list:
    """What patch() did with each assigner of the installed release, and with its RT-DETR matcher: lines "NAME:
    patched (rule set R)" (the matcher: "patched (its cost variant)") or "NAME: left to ultralytics (why)". Empty
    when not patched. The matcher's check runs here if no matcher was built yet."""
    if not STATE.is_patched():
        return []
    if isinstance(LucidHungarianMatcher.variant, Pending):
        _settle_matcher()
    return ([f"{name}: patched ({'' if name == MATCHER else 'rule set '}{rules})" for name, rules in _rules.items()] +
            [f"{name}: left to ultralytics ({why})" for name, why in _left.items()])


def unpatch() -> None:
    """Restore the peer exactly as it was. Harmless when not patched."""
    global _rules, _left
    if STATE.originals is None:
        return
    for (module, name), original in STATE.originals.items():
        setattr(sys.modules[module], name, original)
    STATE.originals, _rules, _left = None, {}, {}
    LucidHungarianMatcher.variant, LucidHungarianMatcher.backend = None, "auto"


def is_patched() -> bool:
    """True while patch() is in effect (between patch() and unpatch())."""
    return STATE.is_patched()


def patched(backend: str = "auto"):
    """``with patched(): ...`` patches for the block; leaving it restores exactly the state before it: the peer
    unpatched, or patched with the backend it had."""
    return _patching.patched(STATE, patch, unpatch, backend)
