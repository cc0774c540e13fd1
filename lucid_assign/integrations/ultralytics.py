"""Make the peer trainer's (ultralytics) detection and OBB losses use lucid-assign's assigners.

    from lucid_assign.integrations import ultralytics as lucid_ultralytics
    lucid_ultralytics.patch()      # before the trainer builds its loss (the first training step)

What changes: the names ``TaskAlignedAssigner`` and ``RotatedTaskAlignedAssigner`` of ``ultralytics.utils.loss``,
which ``v8DetectionLoss``, ``v8OBBLoss`` and ``E2ELoss`` (YOLO26: one assignment with top-k 10 and one with top-k 7
and top-k2 1) instantiate, become lucid-assign's drop-in classes. Losses built before ``patch()`` keep the assigner
they have. The speed and memory of the assignment change; its results do not (see the README).

Left on the peer's code, on purpose: the pose and segmentation assigners (``PoseTaskAlignedAssigner``,
``SegTaskAlignedAssigner``), whose overlap is keypoint OKS or mask IoU, not a box overlap; and any call that passes
such extra inputs to a patched assigner is handed to the peer's class.

Nothing is imported from ultralytics until ``patch()`` is called; a missing package or a version whose assigner
interface differs gives a clear error.
"""

from __future__ import annotations

import contextlib
import inspect

from .. import assigner as _ours

SUPPORTED_VERSIONS = ("8.4.",)  # versions whose assigner interface and loss wiring were checked
_EXPECTED_ARGS = ("topk", "num_classes", "alpha", "beta", "stride", "eps", "topk2")
_originals: dict | None = None


def _peer():
    try:
        import ultralytics
        from ultralytics.utils import loss, tal
    except ImportError as exc:
        raise ImportError(
            "lucid_assign.integrations.ultralytics needs the ultralytics package "
            "(pip install ultralytics==8.4.190)"
        ) from exc
    version = getattr(ultralytics, "__version__", "unknown")
    if not version.startswith(SUPPORTED_VERSIONS):
        raise RuntimeError(
            f"ultralytics {version} is not a version whose assigners lucid-assign was checked against "
            f"({', '.join(v + 'x' for v in SUPPORTED_VERSIONS)})"
        )
    for name in ("TaskAlignedAssigner", "RotatedTaskAlignedAssigner"):
        cls = getattr(loss, name, None)
        if cls is None:
            raise RuntimeError(f"ultralytics {version}: ultralytics.utils.loss has no {name}; cannot patch")
        params = inspect.signature(getattr(tal, name).__init__).parameters
        missing = [p for p in _EXPECTED_ARGS if p not in params]
        if missing:
            raise RuntimeError(f"ultralytics {version}: {name}() lacks the arguments {missing}; cannot patch")
    return loss, tal


def _wrap(ours_cls, peer_cls, backend: str):
    class Patched(ours_cls):
        """lucid-assign's assigner in the peer's loss; extra (non-box) overlap inputs go to the peer's class."""

        def __init__(self, *args, **kwargs):
            kwargs.setdefault("backend", backend)
            super().__init__(*args, **kwargs)

        def forward(self, pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt, **extra):
            if extra:
                peer = peer_cls(topk=self.topk, num_classes=self.num_classes, alpha=self.alpha, beta=self.beta,
                                stride=self.stride, eps=self.eps, topk2=self.topk2)
                return peer(pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt, **extra)
            return super().forward(pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt)

    Patched.__name__ = Patched.__qualname__ = f"Lucid{peer_cls.__name__}"
    return Patched


def patch(backend: str = "auto") -> None:
    """Make the peer's detection and OBB losses build lucid-assign's assigners. Calling it again is harmless (the
    latest ``backend`` applies)."""
    global _originals
    loss, tal = _peer()
    if _originals is None:
        _originals = {name: getattr(loss, name) for name in ("TaskAlignedAssigner", "RotatedTaskAlignedAssigner")}
    loss.TaskAlignedAssigner = _wrap(_ours.TaskAlignedAssigner, _originals["TaskAlignedAssigner"], backend)
    loss.RotatedTaskAlignedAssigner = _wrap(
        _ours.RotatedTaskAlignedAssigner, _originals["RotatedTaskAlignedAssigner"], backend
    )


def unpatch() -> None:
    """Restore the peer exactly as it was. Harmless when not patched."""
    global _originals
    if _originals is None:
        return
    from ultralytics.utils import loss

    for name, cls in _originals.items():
        setattr(loss, name, cls)
    _originals = None


def is_patched() -> bool:
    return _originals is not None


@contextlib.contextmanager
def patched(backend: str = "auto"):
    """``with patched(): ...`` patches for the block and restores the peer afterwards."""
    was = is_patched()
    patch(backend)
    try:
        yield
    finally:
        if not was:
            unpatch()
