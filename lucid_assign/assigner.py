"""Drop-in modules with the constructor and forward() of the peer trainer's assigners."""

from __future__ import annotations

import torch
from torch import nn

from . import dispatch, reference
from .reference import stride_value


class TaskAlignedAssigner(nn.Module):
    """Task-aligned assigner (TOOD) for axis-aligned boxes ``x1 y1 x2 y2``.

    Same constructor and ``forward`` as the peer's ``TaskAlignedAssigner`` (plus ``backend``: "auto", "kernel" or
    "reference", see lucid_assign.dispatch, and ``rules``: the rule set of the peer release to reproduce, docs/spec.md
    "Rule sets"; for 8.0 to 8.3, whose constructor has no ``stride`` or ``topk2``, ``rules="8.0"``, and ``eps`` by
    keyword); the outputs follow docs/spec.md. A box last dimension of 5 (``cx cy w h angle``)
    is assigned as oriented boxes, as RotatedTaskAlignedAssigner does.
    """

    box_dims = (4, 5)

    def __init__(
        self,
        topk: int = 13,
        num_classes: int = 80,
        alpha: float = 1.0,
        beta: float = 6.0,
        stride: list | None = None,
        eps: float = 1e-9,
        topk2: int | None = None,
        backend: str = "auto",
        rules: str = reference.DEFAULT_RULES,
    ):
        super().__init__()
        if backend not in dispatch.BACKENDS:
            raise ValueError(f"backend must be one of {dispatch.BACKENDS}, got {backend!r}")
        reference.check_rules(rules, topk, topk2)
        self.backend = backend
        self.rules = rules
        self.topk = topk
        self.topk2 = topk2 or topk
        self.num_classes = num_classes
        self.alpha = alpha
        self.beta = beta
        try:
            self.stride = list(stride) if stride is not None else [8, 16, 32]
        except TypeError:
            raise ValueError(f"stride must be a non-empty list of positive numbers, got {stride!r}") from None
        self.stride_val = stride_value(self.stride)
        self.eps = eps

    task = dispatch.TASKS["assign"]

    def _task_settings(self) -> dict:
        return {}

    def _assign(self, box: tuple, extra: tuple = (), on_unsupported=None):
        """The assignment of the six box inputs ``box`` and the pose or mask inputs ``extra`` with this module's
        settings (dispatch.run; ``on_unsupported``: as there)."""
        gt_bboxes = box[4]
        if isinstance(gt_bboxes, torch.Tensor) and gt_bboxes.dim() == 3 and gt_bboxes.shape[-1] not in self.box_dims:
            raise ValueError(f"{type(self).__name__} takes gt_bboxes with last dim in {self.box_dims}, got "
                             f"{tuple(gt_bboxes.shape)}")
        settings = dict(topk=self.topk, topk2=self.topk2, num_classes=self.num_classes, alpha=self.alpha,
                        beta=self.beta, eps=self.eps, stride=self.stride, rules=self.rules)
        return dispatch.run(self.task, box, extra, settings, self._task_settings(), self.backend, on_unsupported)

    @torch.no_grad()
    def forward(self, pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt):
        """Returns ``(target_labels, target_bboxes, target_scores, fg_mask, target_gt_idx)``."""
        return self._assign((pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt))

    def extra_repr(self) -> str:
        return (
            f"topk={self.topk}, topk2={self.topk2}, num_classes={self.num_classes}, alpha={self.alpha}, "
            f"beta={self.beta}, stride={self.stride}, backend={self.backend!r}, rules={self.rules!r}"
        )


class RotatedTaskAlignedAssigner(TaskAlignedAssigner):
    """Task-aligned assigner for oriented boxes ``cx cy w h angle`` (radians), overlap by probabilistic IoU."""

    box_dims = (5,)


class PoseTaskAlignedAssigner(TaskAlignedAssigner):
    """Task-aligned assigner for pose (docs/spec.md, "Pose"): axis-aligned boxes ``x1 y1 x2 y2``, candidates gated by
    pyramid level, and the keypoint OKS as the overlap (the box CIoU for objects without visible keypoints).

    Same constructor and ``forward`` as the peer's ``PoseTaskAlignedAssigner``: ``sigmas`` (K,) first, then the
    arguments of TaskAlignedAssigner (and ``backend``); ``forward`` takes the per-anchor strides ``anc_strides`` (A,)
    after ``mask_gt`` and the keypoints as ``pd_kpts`` (B, A, K, 2) and ``gt_kpts`` (B, M, K, 3), in pixels. The class
    attribute ``level_range`` (lo, hi) is the gate: an object of side s is a candidate on levels of stride t with
    ``lo * t <= s <= hi * t``.
    """

    box_dims = (4,)
    level_range = reference.LEVEL_RANGE

    def __init__(self, sigmas: torch.Tensor, **kwargs):
        super().__init__(**kwargs)
        self.sigmas = sigmas

    task = dispatch.TASKS["assign_pose"]

    def _task_settings(self) -> dict:
        return {"level_range": self.level_range}

    @torch.no_grad()
    def forward(self, pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt, anc_strides, pd_kpts=None,
                gt_kpts=None):
        """Returns ``(target_labels, target_bboxes, target_scores, fg_mask, target_gt_idx)``."""
        if pd_kpts is None or gt_kpts is None:
            raise TypeError(f"{type(self).__name__}.forward needs pd_kpts (B, A, K, 2) and gt_kpts (B, M, K, 3)")
        return self._assign((pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt),
                            (anc_strides, pd_kpts, gt_kpts, self.sigmas))


class SegTaskAlignedAssigner(TaskAlignedAssigner):
    """Task-aligned assigner for segmentation (docs/spec.md, "Segmentation"): axis-aligned boxes ``x1 y1 x2 y2`` whose
    overlap is the mean of the box CIoU and the IoU of the object's mask with the anchor's predicted mask, for each
    object's ``3 * topk`` best pairs by box metric (the box CIoU halved for the others).

    Same constructor and ``forward`` as the peer's ``SegTaskAlignedAssigner``: the arguments of TaskAlignedAssigner
    (and ``backend``); ``forward`` takes, after ``mask_gt``, the mask coefficients ``pd_coef`` (B, A, nm), the scale
    from box units to mask pixels ``mask_scale`` (B, 1), the prototypes ``proto`` (B, nm, mh, mw) and the object masks
    ``gt_masks`` (B, >= M, mh, mw). A call synchronises once with the device (the decode of the masks takes its shapes
    from the chosen pairs).
    """

    box_dims = (4,)

    task = dispatch.TASKS["assign_seg"]

    @torch.no_grad()
    def forward(self, pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt, pd_coef=None, mask_scale=None,
                proto=None, gt_masks=None):
        """Returns ``(target_labels, target_bboxes, target_scores, fg_mask, target_gt_idx)``."""
        if pd_coef is None or mask_scale is None or proto is None or gt_masks is None:
            raise TypeError(f"{type(self).__name__}.forward needs pd_coef (B, A, nm), mask_scale (B, 1), proto "
                            f"(B, nm, mh, mw) and gt_masks (B, M, mh, mw)")
        return self._assign((pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt),
                            (pd_coef, mask_scale, proto, gt_masks))
