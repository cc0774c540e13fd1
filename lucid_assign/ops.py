"""Typed wrappers over the compiled ops in the ``lucid`` namespace, with their fake (meta) kernels.

The schemas are declared once, in csrc/ops.cpp; each wrapper here documents one of them. The fake kernels let
``torch.compile`` and CUDA-graph capture reason about the ops without running them.
"""

from __future__ import annotations

import itertools

import torch

from . import _library, reference


def _region(tensor: torch.Tensor, given: torch.dtype | None) -> torch.dtype | None:
    """The autocast region to give a fused op: ``given``, else the region the call is made in (None outside one).

    The op's autocast kernel would fill it in too; passing it from here puts it into the graph that torch.compile's
    Dynamo records (it folds the region to a constant and guards on it), which is what torch's compiled-graph caches
    key on: a graph compiled in one region is then never reused in another."""
    if given is not None:
        return given
    kind = tensor.device.type
    return torch.get_autocast_dtype(kind) if kind in ("cpu", "cuda") and torch.is_autocast_enabled(kind) else None


def _require(op: str) -> None:
    if not _library.loaded():
        raise RuntimeError(f"torch.ops.lucid.{op} needs the compiled library, which is not loaded: "
                           f"{_library.LOAD_ERROR}")


def points_in_boxes(
    anc_points: torch.Tensor, gt_bboxes: torch.Tensor, mask_gt: torch.Tensor, stride_val: float, *,
    rules: str = reference.DEFAULT_RULES, first_stride: float | None = None,
) -> torch.Tensor:
    """Containment pass, ``torch.ops.lucid.points_in_boxes`` (step 1 of docs/spec.md).

    Args:
        anc_points: (A, 2) anchor centres, float32 or float64.
        gt_bboxes: (B, M, 4) axis-aligned ``x1 y1 x2 y2`` or (B, M, 5) oriented ``cx cy w h angle``, dtype of anchors.
        mask_gt: (B, M, 1) or (B, M), nonzero for real objects; only those get the side floor.
        stride_val: the small-target side floor; sides of real objects below it are raised to it about the centre.
        rules: the peer's rule set (docs/spec.md, "Rule sets"); first_stride: the trainer's ``stride[0]``, which rule
            sets 8.4.0 and 8.4.8 need (the floor's threshold).

    Returns:
        (B, M, A) bool: anchor a lies in the candidate region of box m of image b (strict for HBB, closed for OBB).
        The validity mask is not applied to the result.
    """
    _require("points_in_boxes")
    return torch.ops.lucid.points_in_boxes.default(anc_points, gt_bboxes, mask_gt, float(stride_val), rules=rules,
                                                   first_stride=_opt_float(first_stride))


def pair_overlaps(gt_bboxes: torch.Tensor, pd_bboxes: torch.Tensor) -> torch.Tensor:
    """Overlap of paired boxes, ``torch.ops.lucid.pair_overlaps`` (step 2).

    Args:
        gt_bboxes: (N, 4) ``x1 y1 x2 y2`` or (N, 5) ``cx cy w h angle``, float32 or float64.
        pd_bboxes: same shape and dtype.

    Returns:
        (N,) Complete-IoU (HBB) or probabilistic IoU (OBB) of row i of each, clamped below at 0.
    """
    _require("pair_overlaps")
    return torch.ops.lucid.pair_overlaps.default(gt_bboxes, pd_bboxes)


def box_metrics(pd_scores, pd_bboxes, gt_labels, gt_bboxes, candidates, alpha: float = 1.0, beta: float = 6.0):
    """Class gather, alignment metric and masking, ``torch.ops.lucid.box_metrics`` (step 2), dense.

    Args:
        pd_scores: (B, A, C); pd_bboxes: (B, A, 4|5); gt_labels: (B, M, 1); gt_bboxes: (B, M, 4|5).
        candidates: (B, M, A) bool, the pairs to evaluate (inside the candidate region and a real object).

    Returns:
        ``(align_metric, overlaps)``, each (B, M, A): at candidate pairs ``s^alpha * o^beta`` with ``s`` the score of
        the object's class and ``o`` the pair overlap; 0 elsewhere. Labels of candidate pairs must be in [0, C).
    """
    _require("box_metrics")
    return torch.ops.lucid.box_metrics.default(
        pd_scores, pd_bboxes, gt_labels, gt_bboxes, candidates, float(alpha), float(beta)
    )


def resolve_conflicts(mask_pos: torch.Tensor, overlaps: torch.Tensor) -> torch.Tensor:
    """Conflict resolution, ``torch.ops.lucid.resolve_conflicts`` (step 4 of docs/spec.md), dense.

    Args:
        mask_pos: (B, M, A) bool, the positives of each object.
        overlaps: (B, M, A) float, the pair overlaps (0 where not a candidate).

    Returns:
        (B, M, A) bool: an anchor positive for two or more objects keeps only the object with the largest overlap
        over all M rows (ties and NaN: the first), which need not be one that claimed it; other anchors unchanged.
    """
    _require("resolve_conflicts")
    return torch.ops.lucid.resolve_conflicts.default(mask_pos, overlaps)


def assign(
    pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt, *, topk: int = 13, topk2: int | None = None,
    num_classes: int = 80, alpha: float = 1.0, beta: float = 6.0, eps: float = 1e-9, stride_val: float = 16.0,
    rules: str = reference.DEFAULT_RULES, first_stride: float | None = None, autocast_dtype: torch.dtype | None = None,
):
    """The whole assignment, ``torch.ops.lucid.assign`` (steps 1-6), without any (B, M, A) tensor.

    Args:
        pd_scores: (B, A, C) float32/float16/bfloat16 (float64 with float64 boxes).
        pd_bboxes, gt_bboxes: (B, A, D) and (B, M, D), D = 4 (HBB) or 5 (OBB), float32 or float64.
        anc_points: (A, 2), dtype of the boxes or a narrower float type (widened exactly). gt_labels, mask_gt:
            (B, M, 1).
        topk, topk2: K and K2 (``topk2=None`` means K). stride_val: the side floor (``stride[1]`` of the trainer).
        rules, first_stride: the peer's rule set and the trainer's ``stride[0]``, as for ``points_in_boxes``.
        autocast_dtype: the autocast region whose results to compute (its dtype; None: outside one). Inside
            ``torch.autocast`` the op fills it from the region itself, so a graph that torch.compile records, or a call
            replayed outside the region, gives the results of the region: on CUDA the power of float16/bfloat16
            scores is then taken in float32, as autocast takes the reference's.

    Returns:
        ``(target_labels (B, A) int64, target_bboxes (B, A, D), target_scores (B, A, C) in the boxes' dtype,
        fg_mask (B, A) bool, target_gt_idx (B, A) int64)``. The outputs never require grad.
    """
    _require("assign")
    return torch.ops.lucid.assign.default(
        pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt, int(topk), int(topk2 or topk),
        int(num_classes), float(alpha), float(beta), float(eps), float(stride_val),
        rules=rules, first_stride=_opt_float(first_stride),
        autocast_dtype=_region(pd_scores, autocast_dtype),
    )


def assign_pose(
    pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt, anc_strides, pd_kpts, gt_kpts, sigmas, *,
    topk: int = 13, topk2: int | None = None, num_classes: int = 80, alpha: float = 1.0, beta: float = 6.0,
    eps: float = 1e-9, stride_val: float = 16.0, level_range=(2.0, 12.0), rules: str = reference.DEFAULT_RULES,
    first_stride: float | None = None, autocast_dtype: torch.dtype | None = None,
):
    """The pose assignment, ``torch.ops.lucid.assign_pose`` (docs/spec.md, "Pose"): ``assign`` for x1y1x2y2 boxes
    with step 1 gated by pyramid level and the keypoint OKS as the overlap.

    Args:
        pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt: as for ``assign``, boxes (..., 4).
        anc_strides: (A,) the stride of each anchor, the boxes' dtype or a narrower float type.
        pd_kpts: (B, A, K, 2) predicted keypoints in pixels, any float dtype (rounded to float32 first).
        gt_kpts: (B, M, K, 3) object keypoints x, y, visibility, the boxes' dtype; K <= 63.
        sigmas: (K,) the keypoints' OKS sigmas, the boxes' dtype.
        level_range: (lo, hi): an object of side s is a candidate on the levels of stride t with lo*t <= s <= hi*t.
        autocast_dtype: as for ``assign``.

    Returns:
        as ``assign``.
    """
    _require("assign_pose")
    lo, hi = level_range
    return torch.ops.lucid.assign_pose.default(
        pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt, anc_strides, pd_kpts, gt_kpts, sigmas,
        int(topk), int(topk2 or topk), int(num_classes), float(alpha), float(beta), float(eps), float(stride_val),
        float(lo), float(hi), rules=rules, first_stride=_opt_float(first_stride),
        autocast_dtype=_region(pd_scores, autocast_dtype),
    )


def assign_seg(
    pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt, pd_coef, mask_scale, proto, gt_masks, *,
    topk: int = 13, topk2: int | None = None, num_classes: int = 80, alpha: float = 1.0, beta: float = 6.0,
    eps: float = 1e-9, stride_val: float = 16.0, rules: str = reference.DEFAULT_RULES,
    first_stride: float | None = None, autocast_dtype: torch.dtype | None = None,
):
    """The segmentation assignment, ``torch.ops.lucid.assign_seg`` (docs/spec.md, "Segmentation"): ``assign`` for
    x1y1x2y2 boxes whose overlap is the mean of the box overlap and the mask IoU of each object's min(3 * topk, A) best
    pairs by box metric. It synchronises once with the device (the masks' decode takes shapes from the chosen pairs).

    Args:
        pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt: as for ``assign``, boxes (..., 4).
        pd_coef: (B, A, nm) mask coefficients, any float dtype.
        mask_scale: (B, 1) float32 or float64, mask pixels per box unit.
        proto: (B, nm, mh, mw) prototypes, any float dtype.
        gt_masks: (B, >= M, mh, mw) object masks, bool (or numbers: nonzero is inside).
        autocast_dtype: as for ``assign``; the product of the masks' decode also takes that dtype, as autocast gives
            the reference's (CUDA and CPU).

    Returns:
        as ``assign``.
    """
    _require("assign_seg")
    return torch.ops.lucid.assign_seg.default(
        pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt, pd_coef, mask_scale, proto, gt_masks,
        int(topk), int(topk2 or topk), int(num_classes), float(alpha), float(beta), float(eps), float(stride_val),
        rules=rules, first_stride=_opt_float(first_stride),
        autocast_dtype=_region(pd_scores, autocast_dtype),
    )


def linear_sum_assignment(cost: torch.Tensor, sizes: torch.Tensor | None = None):
    """The linear sum assignment, ``torch.ops.lucid.linear_sum_assignment`` (docs/spec.md, "Linear sum assignment"):
    SciPy's ``linear_sum_assignment`` of each problem, on the device of ``cost``, with no host synchronisation.

    Args:
        cost: (R, C) or a batch (B, R, C), float32 or float64 (float16 and bfloat16 are widened exactly, as SciPy
            widens them); +inf forbids a pair.
        sizes: (B,) integers, the valid columns of each problem of a batch (problem b is ``cost[b, :, :sizes[b]]``),
            on the CPU or on the device of ``cost``; None: all C.

    Returns:
        ``(row_ind, col_ind, info)``: row_ind and col_ind (K,) or (B, K) int64, K = min(R, C), each problem's pairs as
        SciPy returns them (rows ascending), then -1; info () or (B,) int32: 0 where solved, 1 where the cost holds
        NaN or -inf, 2 where no complete matching avoids +inf, 3 where a size on the GPU is outside [0, C] (sizes on
        the CPU are checked at the call); the pairs of such a problem are all -1.
    """
    _require("linear_sum_assignment")
    return torch.ops.lucid.linear_sum_assignment.default(cost, sizes)


def linear_sum_assignment_columns(cost: torch.Tensor, sizes: torch.Tensor | None = None):
    """``torch.ops.lucid.linear_sum_assignment.columns``: linear_sum_assignment's solve, its result by row, with no
    host synchronisation. Returns ``(columns, info)``: columns (R,) or (B, R) int64, the column matched to each row
    (-1: none; all -1 where info is not 0), info as linear_sum_assignment's."""
    _require("linear_sum_assignment")
    return torch.ops.lucid.linear_sum_assignment.columns(cost, sizes)


def detr_cost(pred_bboxes: torch.Tensor, pred_scores: torch.Tensor, gt_bboxes: torch.Tensor, gt_cls: torch.Tensor,
                sizes: torch.Tensor, width: int, gains, alpha: float, gamma: float, *, sanitize: bool = True,
                l1_order: int = 1) -> torch.Tensor:
    """The DETR matching cost, ``torch.ops.lucid.detr_cost`` (docs/spec.md, "DETR matching cost"): the focal class
    cost, the L1 and the generalised IoU of (cx, cy, w, h) boxes, weighted, in one pass with no host synchronisation;
    on CUDA, equal bit for bit to the peer's (ultralytics' RT-DETR) chain of PyTorch operations on float32 tensors.

    Args:
        pred_bboxes: (B, Q, 4) and pred_scores (B, Q, C) logits, float (taken to float32 first, as the peer does).
        gt_bboxes: (N, 4) float, gt_cls (N,) integers: the batch's objects, image after image.
        sizes: (B,) integers on the same device, the objects of each image (they add up to N).
        width: the output's columns (the largest count, as the peer pads).
        gains: (class, bbox, giou); alpha, gamma: the focal cost's.
        sanitize: NaN and infinite costs set to 0 (the peer's releases since 8.0.200).
        l1_order: how the L1's four terms are added: 1 as (dx + dw) + (dy + dh) (PyTorch's CUDA sum of four
            values), 0 in turn (its CPU sum).

    Returns:
        (B, Q, width) float32: entry (b, q, j) the cost of query q of image b against its object j, or against the
        peer's padding (a zero box of class 0) for j >= sizes[b]. A column whose object's class is outside [0, C),
        or whose index falls past N (sizes on the GPU are not checked), is NaN.
    """
    _require("detr_cost")
    return torch.ops.lucid.detr_cost.default(pred_bboxes, pred_scores, gt_bboxes, gt_cls, sizes, int(width),
                                               [float(g) for g in gains], float(alpha), float(gamma),
                                               sanitize=bool(sanitize), l1_order=int(l1_order))


DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}  # csrc/detr_cost.h's DtypeCode
# the class terms of class_terms and parts
FAMILY_CLASS_TERMS = ("softmax", "focal", "focal-gathered", "rfdetr", "rfdetr-layers")
FAMILY_DTYPES = ("prob", "pow", "log", "cls", "l1", "pred_corners", "gt_corners", "pairs", "sum")  # in the op's order


def detr_family_cost(scores: torch.Tensor, boxes: torch.Tensor, labels: torch.Tensor, objects: torch.Tensor,
                     sizes: torch.Tensor, width: int, groups: int, gains, *, focal: bool, alpha: float = 0.25,
                     gamma: float = 2.0, l1_order: int = 1, dtypes: dict, sanitize: bool = True,
                     class_cost: torch.Tensor | None = None) -> tuple:
    """The cost of transformers' DETR-family matchers for every layer of a loss call at once,
    ``torch.ops.lucid.detr_cost.family`` (docs/spec.md, "DETR family cost"), with no host synchronisation.

    Args:
        scores: (L, B, Q, C) float16, bfloat16 or float32, any strides: the logits (``focal``) or the probabilities
            (a softmax's, DETR's class term: minus the object's class probability).
        boxes: (L, B, Q, 4) the queries' boxes (cx, cy, w, h); labels (N,) integers and objects (N, 4) the batch's
            objects, image after image; sizes (B,) their counts per image, on the same device.
        width: the problems' columns (at least the largest count, at least 1); groups: query groups (dividing Q).
        gains: (class, bbox, giou); alpha, gamma: the focal term's; l1_order: 0 in turn (PyTorch's CPU cdist), 1 as
            (dx + dw) + (dy + dh) (its CUDA cdist).
        dtypes: the dtype of each step, keys FAMILY_DTYPES (float32, bfloat16 or float16); the cost's own is
            float32, whose largest value NaN and +-inf become with ``sanitize``.
        class_cost: (L, B, Q, width), where given, each entry's class term (else computed from ``scores``).

    Returns:
        ``(cost, invalid)``: cost (L * B * groups, Q / groups, width) float32, problem (l, b, g) row i the query
        g * Q / groups + i of image b in layer l against the image's objects (0 past them; NaN for a class outside
        [0, C)); invalid (1,) int32, nonzero where some query's or object's corners are not x2 >= x1, y2 >= y1.
    """
    _require("detr_cost")
    codes = [DTYPE_CODES[dtypes[k]] for k in FAMILY_DTYPES]
    return torch.ops.lucid.detr_cost.family(scores, boxes, labels, objects, sizes, int(width), int(groups),
                                            [float(g) for g in gains], int(bool(focal)), float(alpha), float(gamma),
                                            int(l1_order), codes, bool(sanitize),
                                            float(torch.finfo(torch.float32).max), class_cost)


def detr_family_parts_cost(scores: list, boxes: list, labels: torch.Tensor, objects: torch.Tensor,
                           sizes: torch.Tensor, width: int, groups: int, gains, *, class_term: str, alpha: float = 0.25,
                           gamma: float = 2.0, l1_order: int = 1, dtypes: list, sanitize: bool = True) -> tuple:
    """The cost of transformers' DETR-family matchers for several stacks (parts) of one loss call at once,
    ``torch.ops.lucid.detr_cost.parts`` (docs/spec.md, "DETR family cost"): detr_family_cost of each part, its
    problems part after part, with each part's class term computed from its logits as the family computes it.

    Args:
        scores, boxes: lists of the parts' (L_p, B, Q, C) logits and (L_p, B, Q, 4) boxes (cx, cy, w, h), each part
            of its own dtypes and strides, the same B and Q; a part of one layer may be (B, Q, C) and (B, Q, 4).
        class_term: one of FAMILY_CLASS_TERMS (the family's: DETR's softmax, the focal families' focal, RT-DETR's
            focal of the object's probability; "rfdetr": RF-DETR's detection cost, its focal term through log-sigmoid
            and its boxes: w and h clamped at 0, the union and the enclosing area floored at 1e-7; "rfdetr-layers":
            RF-DETR's as each layer's forward computes it, a part whose boxes are of the objects' dtype as "rfdetr" a
            layer at a time, any other over the cross product of the queries and the objects: its class term, on the
            CPU, on that (B * Q, N) tensor).
        dtypes: one dict per part, as detr_family_cost's.
        The rest as detr_family_cost's.

    Returns:
        ``(cost, invalid)`` as detr_family_cost's, for every part's layers.
    """
    _require("detr_cost")
    codes = [DTYPE_CODES[plan[k]] for plan in dtypes for k in FAMILY_DTYPES]
    return torch.ops.lucid.detr_cost.parts(list(scores), list(boxes), labels, objects, sizes, int(width),
                                           int(groups), [float(g) for g in gains],
                                           FAMILY_CLASS_TERMS.index(class_term), float(alpha), float(gamma),
                                           int(l1_order), codes, bool(sanitize), float(torch.finfo(torch.float32).max))


def focal_terms(p: torch.Tensor, alpha: float, gamma: float) -> tuple:
    """The focal cost's (positive, negative) terms of probabilities p: the DETR families' operations, in their
    order."""
    neg = (1 - alpha) * (p**gamma) * (-(1 - p + 1e-8).log())
    pos = alpha * ((1 - p) ** gamma) * (-(p + 1e-8).log())
    return pos, neg


def rfdetr_focal_terms(logits: torch.Tensor, alpha: float, gamma: float) -> torch.Tensor:
    """RF-DETR's focal class cost of logits already gathered at the objects' classes: its operations, in its order
    (through log-sigmoid)."""
    p = logits.sigmoid()
    neg = (1 - alpha) * (p**gamma) * (-torch.nn.functional.logsigmoid(-logits))
    pos = alpha * ((1 - p) ** gamma) * (-torch.nn.functional.logsigmoid(logits))
    return pos - neg


def family_class_terms_reference(logits: torch.Tensor, labels: torch.Tensor, class_term: str, alpha: float = 0.25,
                                 gamma: float = 2.0, sizes: torch.Tensor | None = None) -> torch.Tensor:
    """The class term of a DETR family for each (layer, image, query, object of the image), (L, B, Q, W), with the
    family's own operations: ``class_term`` one of FAMILY_CLASS_TERMS: minus the softmax probability of the object's
    class; the focal terms of every class, then the object's taken; or the object's probability taken, then its focal
    terms (each layer's probabilities on its own (B * Q, C) tensor); RF-DETR's focal terms of the logits gathered at
    the objects' classes, every layer at once (its stacked (L * B, Q, W) tensor); or over the cross product
    ("rfdetr-layers": each layer's (B * Q, N) logits at every object's class, as its forward's full cost, each image's
    block taken, 0 past its objects). labels (B, W): each image's objects' classes, padded; sizes (B,) their counts
    (for "rfdetr-layers")."""
    layers, bs, nq, nc = logits.shape
    if class_term == "rfdetr-layers":
        counts = [int(n) for n in sizes]
        objects = torch.cat([labels[b, :n] for b, n in enumerate(counts)])
        terms = []
        for k in range(layers):
            cross = rfdetr_focal_terms(logits[k].flatten(0, 1)[:, objects], alpha, gamma).view(bs, nq, len(objects))
            blocks = cross.new_zeros(bs, nq, labels.shape[1])
            for b, (start, n) in enumerate(zip([0, *itertools.accumulate(counts)], counts)):
                blocks[b, :, :n] = cross[b, :, start:start + n]
            terms.append(blocks)
        return torch.stack(terms)
    if class_term == "rfdetr":
        index = labels.repeat(layers, 1)[:, None, :].expand(layers * bs, nq, labels.shape[1])
        gathered = logits.reshape(layers * bs, nq, nc).gather(2, index)
        return rfdetr_focal_terms(gathered, alpha, gamma).view(layers, bs, nq, labels.shape[1])
    index = labels[:, None, :].expand(bs, nq, labels.shape[1])
    terms = []
    for k in range(layers):
        flat = logits[k].flatten(0, 1)
        if class_term == "softmax":
            terms.append(-flat.softmax(-1).view(bs, nq, nc).gather(2, index))
        elif class_term == "focal":
            pos, neg = focal_terms(flat.sigmoid(), alpha, gamma)
            terms.append(pos.view(bs, nq, nc).gather(2, index) - neg.view(bs, nq, nc).gather(2, index))
        else:
            pos, neg = focal_terms(torch.sigmoid(flat).view(bs, nq, nc).gather(2, index), alpha, gamma)
            terms.append(pos - neg)
    return torch.stack(terms)


def family_class_terms(logits: torch.Tensor, labels: torch.Tensor, sizes: torch.Tensor, width: int, class_term: str,
                       alpha: float = 0.25, gamma: float = 2.0) -> torch.Tensor:
    """``torch.ops.lucid.detr_cost.class_terms`` (CPU): family_class_terms_reference's result (the same ATen operations
    on the same tensors, bit for bit), every layer in one call from Python. logits (L, B, Q, C) floating point; labels
    (N,) int64, the batch's objects' classes image after image; sizes (B,) int64 their counts, at most ``width``, the
    result's columns (class 0 past an image's objects)."""
    _require("detr_cost")
    if logits.device.type != "cpu":  # on CUDA detr_cost.family computes the class term itself
        raise ValueError(f"logits: family_class_terms runs on the CPU, got a tensor on {logits.device}")
    return torch.ops.lucid.detr_cost.class_terms(logits, labels, sizes, int(width),
                                                 FAMILY_CLASS_TERMS.index(class_term), float(alpha), float(gamma))


def _opt_float(x) -> float | None:
    return None if x is None else float(x)


def _one_device(*tensors) -> None:
    """The check of every kernel (csrc/checks.h) in the fake kernels, which also serve meta tensors: a call that mixes
    meta tensors with others is refused as one that mixes CPU and CUDA tensors is."""
    first = tensors[0].device
    for t in tensors[1:]:
        torch._check_value(t.device == first, lambda: f"all inputs must be on one device: got {first} and {t.device}")


if _library.loaded():

    @torch.library.register_fake("lucid::points_in_boxes")
    def _points_in_boxes_fake(anc_points, gt_bboxes, mask_gt, stride_val, rules=reference.DEFAULT_RULES,
                              first_stride=None):
        _one_device(anc_points, gt_bboxes, mask_gt)
        torch._check(anc_points.dim() == 2, lambda: f"anc_points must be (A, 2), got {tuple(anc_points.shape)}")
        torch._check(gt_bboxes.dim() == 3, lambda: f"gt_bboxes must be (B, M, 4|5), got {tuple(gt_bboxes.shape)}")
        bs, n_boxes = gt_bboxes.shape[:2]
        return gt_bboxes.new_empty((bs, n_boxes, anc_points.shape[0]), dtype=torch.bool)

    @torch.library.register_fake("lucid::pair_overlaps")
    def _pair_overlaps_fake(gt_bboxes, pd_bboxes):
        _one_device(gt_bboxes, pd_bboxes)
        return gt_bboxes.new_empty(gt_bboxes.shape[:1])

    @torch.library.register_fake("lucid::box_metrics")
    def _box_metrics_fake(pd_scores, pd_bboxes, gt_labels, gt_bboxes, candidates, alpha, beta):
        _one_device(pd_scores, pd_bboxes, gt_labels, gt_bboxes, candidates)
        shape = candidates.shape
        return pd_scores.new_empty(shape, dtype=gt_bboxes.dtype), pd_bboxes.new_empty(shape)

    @torch.library.register_fake("lucid::resolve_conflicts")
    def _resolve_conflicts_fake(mask_pos, overlaps):
        _one_device(mask_pos, overlaps)
        return torch.empty_like(mask_pos, memory_format=torch.contiguous_format)

    @torch.library.register_fake("lucid::assign_pose")
    def _assign_pose_fake(pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt, anc_strides, pd_kpts,
                          gt_kpts, sigmas, topk, topk2, num_classes, alpha, beta, eps, stride_val, level_lo, level_hi,
                          rules=reference.DEFAULT_RULES, first_stride=None, autocast_dtype=None):
        _one_device(pd_scores, anc_strides, pd_kpts, gt_kpts, sigmas)
        return _assign_fake(pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt, topk, topk2, num_classes,
                            alpha, beta, eps, stride_val)

    @torch.library.register_fake("lucid::assign_seg")
    def _assign_seg_fake(pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt, pd_coef, mask_scale, proto,
                         gt_masks, topk, topk2, num_classes, alpha, beta, eps, stride_val,
                         rules=reference.DEFAULT_RULES, first_stride=None, autocast_dtype=None):
        _one_device(pd_scores, pd_coef, mask_scale, proto, gt_masks)
        return _assign_fake(pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt, topk, topk2, num_classes,
                            alpha, beta, eps, stride_val)

    def _lsap_fake_checks(cost, sizes):
        torch._check_value(cost.dim() in (2, 3), lambda: f"cost must be (R, C) or (B, R, C), got {tuple(cost.shape)}")
        if sizes is not None:
            torch._check_value(cost.dim() == 3 and tuple(sizes.shape) == tuple(cost.shape[:1]),
                               lambda: f"sizes must be (B,) for a batch of costs {tuple(cost.shape)}, got "
                                       f"{tuple(sizes.shape)}")

    @torch.library.register_fake("lucid::linear_sum_assignment")
    def _linear_sum_assignment_fake(cost, sizes=None):
        _lsap_fake_checks(cost, sizes)
        lead, (rows, cols) = tuple(cost.shape[:-2]), cost.shape[-2:]
        k = torch.sym_min(rows, cols)
        pairs = cost.new_empty((*lead, k), dtype=torch.long)
        return pairs, torch.empty_like(pairs), cost.new_empty(lead, dtype=torch.int32)

    @torch.library.register_fake("lucid::linear_sum_assignment.columns")
    def _linear_sum_assignment_columns_fake(cost, sizes=None):
        _lsap_fake_checks(cost, sizes)
        lead = tuple(cost.shape[:-2])
        return cost.new_empty((*lead, cost.shape[-2]), dtype=torch.long), cost.new_empty(lead, dtype=torch.int32)

    @torch.library.register_fake("lucid::detr_cost")
    def _detr_cost_fake(pred_bboxes, pred_scores, gt_bboxes, gt_cls, sizes, width, gains, alpha, gamma,
                          sanitize=True, l1_order=1):
        _one_device(pred_scores, pred_bboxes, gt_bboxes, gt_cls, sizes)
        torch._check_value(pred_scores.dim() == 3,
                           lambda: f"pred_scores must be (B, Q, C), got {tuple(pred_scores.shape)}")
        torch._check_value(width >= 0, lambda: f"width must be >= 0, got {width}")
        bs, queries = pred_scores.shape[:2]
        return pred_scores.new_empty((bs, queries, width), dtype=torch.float32)

    @torch.library.register_fake("lucid::detr_cost.family")
    def _detr_family_cost_fake(scores, boxes, labels, objects, sizes, width, groups, gains, class_term, alpha, gamma,
                               l1_order, dtypes, sanitize, top, class_cost=None):
        _one_device(scores, boxes, labels, objects, sizes)
        torch._check_value(scores.dim() == 4, lambda: f"scores must be (L, B, Q, C), got {tuple(scores.shape)}")
        torch._check_value(width >= 1, lambda: f"width must be >= 1, got {width}")
        layers, bs, queries = scores.shape[:3]
        torch._check_value(groups >= 1 and queries % groups == 0,
                           lambda: f"groups must be >= 1 and divide the queries ({queries}), got {groups}")
        return (scores.new_empty((layers * bs * groups, queries // groups, width), dtype=torch.float32),
                scores.new_empty((1,), dtype=torch.int32))

    @torch.library.register_fake("lucid::detr_cost.parts")
    def _detr_family_parts_fake(scores, boxes, labels, objects, sizes, width, groups, gains, class_kind, alpha, gamma,
                                l1_order, dtypes, sanitize, top):
        torch._check_value(len(scores) >= 1 and len(boxes) == len(scores),
                           lambda: f"scores and boxes must hold one stack per part, got {len(scores)}, {len(boxes)}")
        torch._check_value(len(dtypes) == 9 * len(scores),
                           lambda: f"dtypes must be 9 codes per part, got {len(dtypes)} for {len(scores)}")
        scores, boxes = ([t[None] if t.dim() == 3 else t for t in parts] for parts in (scores, boxes))  # one layer
        found = [_detr_family_cost_fake(s, b, labels, objects, sizes, width, groups, gains, int(class_kind != 0),
                                        alpha, gamma, l1_order, dtypes[9 * p: 9 * p + 9], sanitize, top)
                 for p, (s, b) in enumerate(zip(scores, boxes))]
        for p, s in enumerate(scores[1:], 1):
            torch._check_value(s.shape[1] == scores[0].shape[1] and s.shape[2] == scores[0].shape[2],
                               lambda: f"scores[{p}] must have the images and queries of scores[0], got {s.shape}")
        rows = sum(cost.shape[0] for cost, _ in found)
        return found[0][0].new_empty((rows, *found[0][0].shape[1:])), found[0][1]

    @torch.library.register_fake("lucid::detr_cost.class_terms")
    def _detr_class_terms_fake(logits, labels, sizes, width, kind, alpha, gamma):
        _one_device(logits, labels, sizes)
        torch._check_value(logits.dim() == 4 and logits.shape[0] >= 1,
                           lambda: f"logits must be (L, B, Q, C) with L >= 1, got {tuple(logits.shape)}")
        torch._check_value(labels.dim() == 1, lambda: f"labels must be (N,), got {tuple(labels.shape)}")
        torch._check_value(sizes.dim() == 1 and sizes.shape[0] == logits.shape[1],
                           lambda: f"sizes must be (B,) with B = {logits.shape[1]}, got {tuple(sizes.shape)}")
        torch._check_value(0 <= kind <= 4, lambda: f"kind must be 0, 1, 2, 3 or 4, got {kind}")
        # the families' operations on fake tensors: their shape and dtype in the call's autocast region (RF-DETR's
        # over the cross product: the operations of its compact cost, so its dtype)
        padded = labels.new_zeros((logits.shape[1], width))
        return family_class_terms_reference(logits, padded, FAMILY_CLASS_TERMS[min(kind, 3)], alpha, gamma)

    @torch.library.register_fake("lucid::matches")
    def _matches_fake(rows, cols, pairs, query_offset, object_offset, layers):
        _one_device(rows, cols, pairs)
        torch._check_value(tuple(rows.shape) == tuple(cols.shape),
                           lambda: f"rows and cols must have one shape, got {tuple(rows.shape)}, {tuple(cols.shape)}")
        total = layers * pairs.shape[0]
        return rows.new_empty(total), cols.new_empty(total)

    @torch.library.register_fake("lucid::assign")
    def _assign_fake(pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt, topk, topk2, num_classes,
                     alpha, beta, eps, stride_val, rules=reference.DEFAULT_RULES, first_stride=None,
                     autocast_dtype=None):
        _one_device(pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt)
        torch._check(pd_scores.dim() == 3, lambda: f"pd_scores must be (B, A, C), got {tuple(pd_scores.shape)}")
        bs, n_anchors, n_cls = pd_scores.shape
        box_dim = gt_bboxes.shape[-1]
        return (
            pd_scores.new_empty((bs, n_anchors), dtype=torch.long),
            pd_scores.new_empty((bs, n_anchors, box_dim), dtype=gt_bboxes.dtype),
            pd_scores.new_empty((bs, n_anchors, n_cls), dtype=gt_bboxes.dtype),
            pd_scores.new_empty((bs, n_anchors), dtype=torch.bool),
            pd_scores.new_empty((bs, n_anchors), dtype=torch.long),
        )
