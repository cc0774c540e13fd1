"""The public functional form of the assignment, with argument checks.

Today every call runs the pure-PyTorch reference (lucid_assign.reference); the compiled backends plug in here.
"""

from __future__ import annotations

from typing import Sequence

import torch

from . import _library, reference


def _shape(t: torch.Tensor) -> tuple:
    return tuple(t.shape)


def check_inputs(pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt, *, topk, topk2, num_classes, stride):
    """Raise ValueError/TypeError naming the argument when the inputs do not form a valid assignment problem."""
    tensors = dict(
        pd_scores=pd_scores, pd_bboxes=pd_bboxes, anc_points=anc_points, gt_labels=gt_labels, gt_bboxes=gt_bboxes,
        mask_gt=mask_gt,
    )
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if pd_scores.dim() != 3:
        raise ValueError(f"pd_scores must be (B, A, C), got {_shape(pd_scores)}")
    bs, n_anchors, n_cls = pd_scores.shape
    if gt_bboxes.dim() != 3 or gt_bboxes.shape[-1] not in (4, 5):
        raise ValueError(f"gt_bboxes must be (B, M, 4) or (B, M, 5), got {_shape(gt_bboxes)}")
    n_boxes, box_dim = gt_bboxes.shape[1:]
    expect = {
        "pd_bboxes": ((bs, n_anchors, box_dim), pd_bboxes),
        "anc_points": ((n_anchors, 2), anc_points),
        "gt_labels": ((bs, n_boxes, 1), gt_labels),
        "mask_gt": ((bs, n_boxes, 1), mask_gt),
    }
    if gt_bboxes.shape[0] != bs:
        raise ValueError(f"gt_bboxes has batch {gt_bboxes.shape[0]} but pd_scores has {bs}")
    for name, (shape, t) in expect.items():
        if _shape(t) != shape:
            raise ValueError(f"{name} must have shape {shape} (from pd_scores and gt_bboxes), got {_shape(t)}")
    for name in ("pd_scores", "pd_bboxes", "anc_points", "gt_bboxes"):
        if not tensors[name].is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {tensors[name].dtype}")
    devices = {t.device for t in tensors.values()}
    if len(devices) > 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(str(d) for d in devices)}")
    if n_cls != num_classes:
        raise ValueError(f"num_classes is {num_classes} but pd_scores has {n_cls} classes")
    if int(topk) < 1:
        raise ValueError(f"topk must be >= 1, got {topk}")
    if topk2 is not None and int(topk2) < 1:
        raise ValueError(f"topk2 must be >= 1 (or None for topk), got {topk2}")
    if n_boxes > 0 and max(topk, topk2 or topk) > n_anchors:
        raise ValueError(f"topk ({topk}) and topk2 ({topk2}) must not exceed the number of anchors ({n_anchors})")
    stride = list(stride)
    if not stride or any(not float(s) > 0 for s in stride):
        raise ValueError(f"stride must be a non-empty list of positive numbers, got {stride}")


def assign(
    pd_scores: torch.Tensor,
    pd_bboxes: torch.Tensor,
    anc_points: torch.Tensor,
    gt_labels: torch.Tensor,
    gt_bboxes: torch.Tensor,
    mask_gt: torch.Tensor,
    *,
    topk: int = 13,
    num_classes: int = 80,
    alpha: float = 1.0,
    beta: float = 6.0,
    eps: float = 1e-9,
    stride: Sequence[float] = (8, 16, 32),
    topk2: int | None = None,
):
    """Task-aligned assignment (SPEC.md): HBB when the boxes' last dim is 4, OBB when it is 5.

    Args:
        pd_scores: (B, A, C) predicted class probabilities (after sigmoid), float32, float16 or bfloat16.
        pd_bboxes: (B, A, 4|5) predicted boxes, ``x1 y1 x2 y2`` or ``cx cy w h angle``.
        anc_points: (A, 2) anchor centres, in the units of the boxes.
        gt_labels: (B, M, 1) class ids (float or integer).
        gt_bboxes: (B, M, 4|5) ground-truth boxes, same format as ``pd_bboxes``.
        mask_gt: (B, M, 1) nonzero for real objects, 0 for padding rows.

    Returns:
        ``(target_labels (B, A) int64, target_bboxes (B, A, 4|5), target_scores (B, A, C), fg_mask (B, A) bool,
        target_gt_idx (B, A) int64)``. The inputs are not modified.
    """
    check_inputs(
        pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt,
        topk=topk, topk2=topk2, num_classes=num_classes, stride=stride,
    )
    return reference.assign(
        pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt,
        topk=topk, num_classes=num_classes, alpha=alpha, beta=beta, eps=eps, stride=stride, topk2=topk2,
    )


def backends() -> dict:
    """What can run here: the reference always; the compiled ops per device when the library is loaded."""
    return {
        "reference": True,
        "library": _library.loaded(),
        "library_error": _library.LOAD_ERROR,
        "cpu_ops": sorted(op for op in _OPS if _library.has_kernel(op, "cpu")),
        "cuda_ops": sorted(op for op in _OPS if _library.has_kernel(op, "cuda")),
        "cuda_device": torch.cuda.is_available(),
    }


_OPS = ("points_in_boxes",)
