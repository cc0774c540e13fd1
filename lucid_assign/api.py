"""The public functions of the task-aligned assignment: ``assign`` (boxes, oriented boxes), ``assign_pose``,
``assign_seg``, and ``pad_targets`` (a trainer's flat targets to their padded inputs).

Each runs through the one dispatch (lucid_assign.dispatch): the compiled op where it takes the call, else the
pure-PyTorch reference (``backend``: "auto", "kernel" or "reference"; ``LUCID_ASSIGN_BACKEND`` overrides it). The
settings are checked here, the tensors once: by the op on the kernel path (csrc/checks.h), by lucid_assign.checks on
the reference path and while torch.compile traces a call. The matching (linear sum assignment) is lucid_assign.matching.
"""

from __future__ import annotations

from typing import Sequence

import torch

from . import checks, dispatch, reference
from .dispatch import TASKS


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
    backend: str = "auto",
    rules: str = reference.DEFAULT_RULES,
):
    """Task-aligned assignment (docs/spec.md): HBB when the boxes' last dim is 4, OBB when it is 5.

    Args:
        pd_scores: (B, A, C) predicted class probabilities (after sigmoid), float32, float16 or bfloat16.
        pd_bboxes: (B, A, 4|5) predicted boxes, ``x1 y1 x2 y2`` or ``cx cy w h angle``.
        anc_points: (A, 2) anchor centres, in the units of the boxes.
        gt_labels: (B, M, 1) class ids (float or integer).
        gt_bboxes: (B, M, 4|5) ground-truth boxes, same format as ``pd_bboxes``.
        mask_gt: (B, M, 1) nonzero for real objects, 0 for padding rows.
        backend: "auto", "kernel" or "reference" (lucid_assign.dispatch).
        rules: the rule set of the peer release to reproduce (docs/spec.md, "Rule sets"): "8.4.144" (the default:
            ultralytics 8.4.144 and later), "8.4.128", "8.4.8", "8.4.0", or "8.0" (8.0 to 8.3: YOLOv8 and YOLO11; no
            topk2); for pose also "8.4.180" (8.4.180 to 8.4.186: no level gate, overlap the mean of CIoU and OKS).

    Returns:
        ``(target_labels (B, A) int64, target_bboxes (B, A, 4|5), target_scores (B, A, C), fg_mask (B, A) bool,
        target_gt_idx (B, A) int64)``. The inputs are not modified.

    Under ``torch.compile`` (``fullgraph=True`` too) the checks of shapes, dtypes and settings and the choice of
    backend happen once, while the graph is traced (a new object count does not retrace once the count is dynamic);
    labels out of range are caught by the op itself (CPU: an error; CUDA: a device-side assertion) or, on the
    reference path, by an assertion in the graph.
    """
    settings = dict(topk=topk, topk2=topk2, num_classes=num_classes, alpha=alpha, beta=beta, eps=eps, stride=stride,
                    rules=rules)
    box = (pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt)
    return dispatch.run(TASKS["assign"], box, (), settings, {}, backend)


def assign_pose(
    pd_scores: torch.Tensor,
    pd_bboxes: torch.Tensor,
    anc_points: torch.Tensor,
    gt_labels: torch.Tensor,
    gt_bboxes: torch.Tensor,
    mask_gt: torch.Tensor,
    anc_strides: torch.Tensor,
    pd_kpts: torch.Tensor,
    gt_kpts: torch.Tensor,
    sigmas: torch.Tensor,
    *,
    topk: int = 13,
    num_classes: int = 80,
    alpha: float = 1.0,
    beta: float = 6.0,
    eps: float = 1e-9,
    stride: Sequence[float] = (8, 16, 32),
    topk2: int | None = None,
    level_range: Sequence[float] = reference.LEVEL_RANGE,
    backend: str = "auto",
    rules: str = reference.DEFAULT_RULES,
):
    """The pose assignment (docs/spec.md, "Pose"): ``assign`` for x1y1x2y2 boxes, with candidates gated by pyramid
    level and the keypoint OKS as the overlap (the box CIoU for objects without visible keypoints).

    Args:
        pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt: as for ``assign``, boxes (..., 4).
        anc_strides: (A,) the stride of each anchor (the peer trainer's stride tensor, flattened).
        pd_kpts: (B, A, K, 2) predicted keypoints in pixels.
        gt_kpts: (B, M, K, 3) object keypoints in pixels, x, y and visibility (> 0: visible).
        sigmas: (K,) per-keypoint OKS sigmas.
        level_range: (lo, hi): an object of side s (the square root of its box area) is a candidate on the levels of
            stride t with ``lo * t <= s <= hi * t``; the finest and coarsest levels are open below and above, and an
            object this leaves without candidates keeps all of them.

    Returns and backends: as ``assign``. The kernels take 0 to 63 keypoints, ``gt_kpts`` and ``sigmas`` of the boxes'
    dtype and ``anc_strides`` of it or a narrower float type; other inputs run on the reference with ``"auto"``.
    """
    settings = dict(topk=topk, topk2=topk2, num_classes=num_classes, alpha=alpha, beta=beta, eps=eps, stride=stride,
                    rules=rules)
    box = (pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt)
    pose = (anc_strides, pd_kpts, gt_kpts, sigmas)
    return dispatch.run(TASKS["assign_pose"], box, pose, settings, dict(level_range=level_range), backend)


def assign_seg(
    pd_scores: torch.Tensor,
    pd_bboxes: torch.Tensor,
    anc_points: torch.Tensor,
    gt_labels: torch.Tensor,
    gt_bboxes: torch.Tensor,
    mask_gt: torch.Tensor,
    pd_coef: torch.Tensor,
    mask_scale: torch.Tensor,
    proto: torch.Tensor,
    gt_masks: torch.Tensor,
    *,
    topk: int = 13,
    num_classes: int = 80,
    alpha: float = 1.0,
    beta: float = 6.0,
    eps: float = 1e-9,
    stride: Sequence[float] = (8, 16, 32),
    topk2: int | None = None,
    backend: str = "auto",
    rules: str = reference.DEFAULT_RULES,
):
    """The segmentation assignment (docs/spec.md, "Segmentation"): ``assign`` for x1y1x2y2 boxes whose overlap is the
    mean of the box overlap and the mask IoU, for each object's ``min(3 * topk, A)`` best pairs by box metric (the
    others: the box overlap halved).

    Args:
        pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt: as for ``assign``, boxes (..., 4).
        pd_coef: (B, A, nm) mask coefficients of each anchor.
        mask_scale: (B, 1) mask pixels per box unit (the prototypes' size over the image's).
        proto: (B, nm, mh, mw) mask prototypes; an anchor's mask is ``pd_coef @ proto > 0``, cropped to its box.
        gt_masks: (B, >= M, mh, mw) object masks, bool (or 0/1 numbers: nonzero is inside).

    Returns and backends: as ``assign``. Both backends synchronise once with the device (the decode of the masks takes
    its shapes from the chosen pairs), so the call cannot be captured in a CUDA graph. The kernels take a float32 or
    float64 ``mask_scale``; other inputs run on the reference with ``"auto"``.
    """
    settings = dict(topk=topk, topk2=topk2, num_classes=num_classes, alpha=alpha, beta=beta, eps=eps, stride=stride,
                    rules=rules)
    box = (pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt)
    masks = (pd_coef, mask_scale, proto, gt_masks)
    return dispatch.run(TASKS["assign_seg"], box, masks, settings, {}, backend)


# ---- from a trainer's flat targets to the padded inputs ---------------------------------------------------------


def pad_targets(targets: torch.Tensor, batch_size: int, *, max_objects: int | None = None, device=None,
                check: bool = True):
    """A trainer's flat targets to the assignment's padded inputs ``(gt_labels, gt_bboxes, mask_gt)``.

    Args:
        targets: (N, 6) or (N, 7) rows ``image index, class, box``, the box with 4 values (HBB, ``x1 y1 x2 y2``) or 5
            (OBB, ``cx cy w h angle``), in the units of the anchors, as data loaders collate them (the rows of an
            image need not be adjacent). Floating point; the image index and the class hold integers.
        batch_size: B, the number of images.
        max_objects: M, the objects' dimension of the outputs. None: the largest count of any image when ``targets``
            is on the CPU (read there, no device synchronisation), and N (every row fits) when it is on a GPU, which
            reading the counts would synchronise.
        device: where the outputs go (default: the device of ``targets``); from the CPU, one copy, not blocking the
            host where the rows are in pinned memory.
        check: raise ValueError naming ``targets`` for an image index outside [0, B) or not an integer, or an image
            with more than ``max_objects`` rows. On a GPU that reads the rows (one synchronisation); False never
            synchronises, and such rows are left out (never written out of bounds).

    Returns:
        ``gt_labels`` (B, M, 1) and ``gt_bboxes`` (B, M, 4|5) of the dtype of ``targets``, and ``mask_gt`` (B, M, 1)
        bool; each image's rows in their order in ``targets``, then zero rows with ``mask_gt`` False. ``targets`` is
        not modified.
    """
    checks.require_tensors(("targets",), (targets,))
    if targets.dim() != 2 or targets.shape[1] not in (6, 7):
        raise ValueError(f"targets must be (N, 6) or (N, 7) rows of image index, class and box, got "
                         f"{checks.shape_of(targets)}")
    checks.require_float("targets", targets)
    batch_size = checks.count("batch_size", batch_size, "")
    if max_objects is not None:
        max_objects = checks.count("max_objects", max_objects, " or None")
    n = targets.shape[0]
    image = targets[:, 0]
    valid = (image >= 0) & (image < batch_size) & (image == image.floor())
    index = torch.where(valid, image, batch_size).long()  # rows of no image: the spare image B
    counts = torch.zeros(batch_size + 1, dtype=torch.long, device=targets.device)
    counts.index_add_(0, index, torch.ones_like(index))
    if check and n:  # reads the rows: on a GPU, one synchronisation
        if not bool(valid.all()):
            row = int((~valid).nonzero()[0, 0])
            raise ValueError(f"targets[{row}, 0] must be an image index in [0, batch_size) = [0, {batch_size}), got "
                             f"{float(image[row])}")
        most = int(counts[:batch_size].max()) if batch_size else 0
        if max_objects is not None and most > max_objects:
            raise ValueError(f"targets has {most} rows for image {int(counts[:batch_size].argmax())}, more than "
                             f"max_objects ({max_objects})")
    if max_objects is None:  # a GPU's counts are not read (that would synchronise): every row fits in N
        on_host = targets.device.type == "cpu"
        max_objects = int(counts[:batch_size].max()) if on_host and batch_size and n else (0 if on_host else n)
    # each row's place in its image: rows sorted by image (stable), minus where its image starts
    order = torch.sort(index, stable=True).indices
    starts = counts.cumsum(0) - counts
    image_of = index[order]
    place = torch.arange(n, device=targets.device) - starts[image_of]
    # rows that do not fit (or have no image) go to a spare row and column, dropped below
    spare = (image_of == batch_size) | (place >= max_objects)
    image_of = torch.where(spare, batch_size, image_of)
    place = torch.where(spare, max_objects, place)
    width = targets.shape[1] - 1
    out = targets.new_zeros(batch_size + 1, max_objects + 1, 1 + width)
    out[image_of, place] = torch.cat([torch.ones_like(targets[:, :1]), targets[:, 1:]], 1)[order]
    out = out[:batch_size, :max_objects]
    if device is not None:
        out = out.to(device, non_blocking=True)
    return out[..., 1:2].clone(), out[..., 2:].clone(), out[..., :1] != 0

