"""Typed wrappers over the compiled ops in the ``lucid`` namespace, with their fake (meta) kernels.

The schemas are declared once, in csrc/ops.cpp; each wrapper here documents one of them. The fake kernels let
``torch.compile`` and CUDA-graph capture reason about the ops without running them.
"""

from __future__ import annotations

import torch

from . import _library


def _require(op: str) -> None:
    if not _library.loaded():
        raise RuntimeError(f"torch.ops.lucid.{op} needs the compiled library, which is not loaded: {_library.LOAD_ERROR}")


def points_in_boxes(
    anc_points: torch.Tensor, gt_bboxes: torch.Tensor, mask_gt: torch.Tensor, stride_val: float
) -> torch.Tensor:
    """Containment pass, ``torch.ops.lucid.points_in_boxes`` (SPEC step 1).

    Args:
        anc_points: (A, 2) anchor centres, float32 or float64.
        gt_bboxes: (B, M, 4) axis-aligned ``x1 y1 x2 y2`` or (B, M, 5) oriented ``cx cy w h angle``, dtype of anchors.
        mask_gt: (B, M, 1) or (B, M), nonzero for real objects; only those get the side floor.
        stride_val: the small-target side floor; sides of real objects below it are raised to it about the centre.

    Returns:
        (B, M, A) bool: anchor a lies in the candidate region of box m of image b (strict for HBB, closed for OBB).
        The validity mask is not applied to the result.
    """
    _require("points_in_boxes")
    return torch.ops.lucid.points_in_boxes.default(anc_points, gt_bboxes, mask_gt, float(stride_val))


if _library.loaded():

    @torch.library.register_fake("lucid::points_in_boxes")
    def _points_in_boxes_fake(anc_points, gt_bboxes, mask_gt, stride_val):
        torch._check(anc_points.dim() == 2, lambda: f"anc_points must be (A, 2), got {tuple(anc_points.shape)}")
        torch._check(gt_bboxes.dim() == 3, lambda: f"gt_bboxes must be (B, M, 4|5), got {tuple(gt_bboxes.shape)}")
        bs, n_boxes = gt_bboxes.shape[:2]
        return gt_bboxes.new_empty((bs, n_boxes, anc_points.shape[0]), dtype=torch.bool)
