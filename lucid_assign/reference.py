"""The pure-PyTorch reference assigner: docs/spec.md in executable form.

It builds dense (B, M, A) tensors and is meant to be obviously right, not fast. Each function below is one step of
docs/spec.md and is used on its own by the tests of the matching kernel op.

Arithmetic notes, because the kernels must reproduce these results bit for bit:
- Every formula is a chain of separately rounded tensor operations; the order of the operations is part of the
  contract (see csrc/geometry.h and csrc/rules.h, which mirror it).
- Pair metrics are computed on the gathered candidate pairs (row-major order over (B, M, A)), as one flat batch:
  CPU math functions may round an element differently depending on where it falls in a vector, so the reference
  keeps this layout fixed.
- Top-k never relies on ``torch.topk``'s tie order (which differs between CPU and CUDA): ties go to the lower
  anchor index on every device.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

# The inputs of the assignment, in the order every entry point takes them: the six box inputs, then the pose inputs
# of assign_pose or the mask inputs of assign_seg (docs/spec.md, "Inputs").
INPUTS = ("pd_scores", "pd_bboxes", "anc_points", "gt_labels", "gt_bboxes", "mask_gt")
POSE_INPUTS = ("anc_strides", "pd_kpts", "gt_kpts", "sigmas")
SEG_INPUTS = ("pd_coef", "mask_scale", "proto", "gt_masks")

# Margins and epsilons of docs/spec.md.
HBB_MARGIN = 1e-9  # strict containment margin of the axis-aligned test
IOU_EPS = 1e-7  # eps inside CIoU and probiou
# Pose (docs/spec.md, "Pose"): an object of side s (the square root of its box area) is a candidate on the pyramid
# levels of stride t with LEVEL_RANGE[0] * t <= s <= LEVEL_RANGE[1] * t; its keypoint scale is its box area times
# OKS_AREA_SCALE (the scale of COCO's keypoint evaluation).
LEVEL_RANGE = (2.0, 12.0)
OKS_AREA_SCALE = 0.53


def stride_value(stride: Sequence[float]) -> float:
    """The small-target side floor: ``stride[1]`` when there are two or more strides, else ``stride[0]``."""
    stride = list(stride)
    if not stride:
        raise ValueError("stride must hold at least one value, got []")
    return stride[1] if len(stride) > 1 else stride[0]


# The peer's rule sets (docs/spec.md, "Rule sets"), each named after the first release that follows it:
#   8.0      8.0.0 to 8.3.x (YOLOv8, YOLO11): boxes tested as given (no side floor), no second top-k, classic CIoU;
#   8.4.0    axis-aligned sides below stride[0] raised to stride[1] (oriented boxes: no floor), classic CIoU;
#   8.4.8    sides of both kinds below stride[0] raised to stride_val, classic CIoU;
#   8.4.128  sides below stride_val raised to it, classic CIoU;
#   8.4.144  the same with CIoU's trade-off term rounded as today (ciou); pose: the level gate and the OKS (8.4.187 on);
#   8.4.180  8.4.144 with the pose assignment of 8.4.180 to 8.4.186: no level gate, and the overlap of an object with
#            visible keypoints the mean of its box overlap and the OKS (pose_mean).
RULE_SETS = ("8.0", "8.4.0", "8.4.8", "8.4.128", "8.4.144", "8.4.180")
DEFAULT_RULES = "8.4.144"


def check_rules(rules: str, topk: int, topk2: int | None) -> None:
    """ValueError naming the argument for an unknown rule set, or a second top-k under rules that have none."""
    if rules not in RULE_SETS:
        raise ValueError(f"rules must be one of {RULE_SETS}, got {rules!r}")
    if rules == "8.0" and topk2 not in (None, topk):
        raise ValueError(f"rules '8.0' have no second top-k: topk2 must be None or topk ({topk}), got {topk2}")


def region_rule(rules: str, box_dim: int, stride_val: float, first_stride: float | None):
    """Step 1's rule of a rule set for boxes of width ``box_dim``: ``(below, to, round_trip)``, a real object's side
    below ``below`` raised to ``to`` (-inf: no floor); ``round_trip``: an axis-aligned box goes through centre and
    size, else it is tested as given. ``first_stride`` is the trainer's ``stride[0]`` (rule sets 8.4.0 and 8.4.8)."""
    if rules in ("8.4.128", "8.4.144", "8.4.180"):
        return stride_val, stride_val, True
    if rules == "8.0":
        return -math.inf, 0.0, False
    if rules not in RULE_SETS:
        raise ValueError(f"rules must be one of {RULE_SETS}, got {rules!r}")
    if first_stride is None or not first_stride > 0:
        raise ValueError(f"rules {rules!r} need first_stride (the trainer's stride[0]), got {first_stride}")
    if rules == "8.4.0" and box_dim == 5:
        return -math.inf, 0.0, True
    return first_stride, stride_val, True


def classic_ciou(rules: str) -> bool:
    """Whether step 2's CIoU rounds its trade-off term as the releases before 8.4.144 do (ciou)."""
    return rules not in ("8.4.144", "8.4.180")


def pose_mean(rules: str) -> bool:
    """Whether the pose assignment has no level gate and averages box overlap and OKS (rule set 8.4.180)."""
    return rules == "8.4.180"


# ---------------------------------------------------------------------------------------------------------------
# Step 1: containment (candidate regions)
# ---------------------------------------------------------------------------------------------------------------
def _floor_sides(side: torch.Tensor, valid: torch.Tensor, below: float, to: float) -> torch.Tensor:
    floor = torch.tensor(to, dtype=side.dtype, device=side.device)
    return torch.where((side < below) & valid, floor, side)


def points_in_boxes(
    anc_points: torch.Tensor, gt_bboxes: torch.Tensor, mask_gt: torch.Tensor, stride_val: float,
    rules: str = DEFAULT_RULES, first_stride: float | None = None,
) -> torch.Tensor:
    """(B, M, A) bool: anchor inside the candidate region of each box (step 1) under the rule set ``rules``. The mask
    is not applied."""
    valid = mask_gt.reshape(gt_bboxes.shape[:2]).bool()
    px, py = anc_points[:, 0], anc_points[:, 1]
    below, to, round_trip = region_rule(rules, gt_bboxes.shape[-1], stride_val, first_stride)
    if gt_bboxes.shape[-1] == 4:
        x1, y1, x2, y2 = gt_bboxes.unbind(-1)
        if round_trip:
            cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
            w = _floor_sides(x2 - x1, valid, below, to)
            h = _floor_sides(y2 - y1, valid, below, to)
            hw, hh = w / 2, h / 2
            x1, y1, x2, y2 = cx - hw, cy - hh, cx + hw, cy + hh
        left, top, right, bottom = (t[..., None] for t in (x1, y1, x2, y2))
        inside = (px - left) > HBB_MARGIN
        inside &= (py - top) > HBB_MARGIN
        inside &= (right - px) > HBB_MARGIN
        inside &= (bottom - py) > HBB_MARGIN
        return inside

    boxes = gt_bboxes.clone()  # a private copy: the angle column is read through a strided view of it
    cx, cy, w, h, theta = boxes.unbind(-1)
    w = _floor_sides(w, valid, below, to)
    h = _floor_sides(h, valid, below, to)
    cos, sin = theta.cos(), theta.sin()
    ux, uy = w / 2 * cos, w / 2 * sin
    vx, vy = -h / 2 * sin, h / 2 * cos
    p1x, p1y = cx + ux + vx, cy + uy + vy
    p2x, p2y = cx + ux - vx, cy + uy - vy
    p4x, p4y = cx - ux + vx, cy - uy + vy
    abx, aby = (p2x - p1x)[..., None], (p2y - p1y)[..., None]
    adx, ady = (p4x - p1x)[..., None], (p4y - p1y)[..., None]
    norm_ab = abx * abx + aby * aby
    norm_ad = adx * adx + ady * ady
    apx = px - p1x[..., None]
    apy = py - p1y[..., None]
    dot_ab = apx * abx + apy * aby
    dot_ad = apx * adx + apy * ady
    return (dot_ab >= 0) & (dot_ab <= norm_ab) & (dot_ad >= 0) & (dot_ad <= norm_ad)


# ---------------------------------------------------------------------------------------------------------------
# Step 2: overlap and metric
# ---------------------------------------------------------------------------------------------------------------
def ciou(gt: torch.Tensor, pd: torch.Tensor, eps: float = IOU_EPS, classic: bool = False) -> torch.Tensor:
    """Complete-IoU of paired axis-aligned boxes (N, 4) x1y1x2y2 -> (N,), not clamped. ``classic``: the trade-off term
    ``aspect / (aspect - iou + (1 + eps))`` of the releases before 8.4.144 (another rounding of the same value)."""
    g_x1, g_y1, g_x2, g_y2 = gt.unbind(-1)
    p_x1, p_y1, p_x2, p_y2 = pd.unbind(-1)
    g_w, g_h = g_x2 - g_x1, g_y2 - g_y1 + eps
    p_w, p_h = p_x2 - p_x1, p_y2 - p_y1 + eps
    inter_w = (torch.minimum(g_x2, p_x2) - torch.maximum(g_x1, p_x1)).clamp(min=0)
    inter_h = (torch.minimum(g_y2, p_y2) - torch.maximum(g_y1, p_y1)).clamp(min=0)
    inter = inter_w * inter_h
    union = g_w * g_h + p_w * p_h - inter + eps
    iou = inter / union
    enclose_w = torch.maximum(g_x2, p_x2) - torch.minimum(g_x1, p_x1)
    enclose_h = torch.maximum(g_y2, p_y2) - torch.minimum(g_y1, p_y1)
    diag2 = enclose_w.pow(2) + enclose_h.pow(2) + eps
    centre2 = ((p_x1 + p_x2 - g_x1 - g_x2).pow(2) + (p_y1 + p_y2 - g_y1 - g_y2).pow(2)) / 4
    aspect = (4 / math.pi**2) * ((p_w / p_h).atan() - (g_w / g_h).atan()).pow(2)
    trade_off = aspect / (aspect - iou + (1 + eps)) if classic else aspect / (1 - iou + aspect + eps)
    return iou - (centre2 / diag2 + aspect * trade_off)


def _gaussian(boxes: torch.Tensor):
    """Covariance [[a, c], [c, b]] of the Gaussian of each (N, 5) box: w^2/12, h^2/12 rotated by the angle."""
    var = boxes[:, 2:4].pow(2) / 12
    var_w, var_h = var.unbind(-1)
    theta = boxes[:, 4]
    cos, sin = theta.cos(), theta.sin()
    cos2, sin2 = cos.pow(2), sin.pow(2)
    return var_w * cos2 + var_h * sin2, var_w * sin2 + var_h * cos2, (var_w - var_h) * cos * sin


def probiou(gt: torch.Tensor, pd: torch.Tensor, eps: float = IOU_EPS) -> torch.Tensor:
    """Probabilistic IoU (1 - Hellinger distance) of paired oriented boxes (N, 5) -> (N,), not clamped."""
    g_x, g_y = gt[:, 0], gt[:, 1]
    p_x, p_y = pd[:, 0], pd[:, 1]
    g_a, g_b, g_c = _gaussian(gt)
    p_a, p_b, p_c = _gaussian(pd)
    sa, sb, sc = g_a + p_a, g_b + p_b, g_c + p_c
    det = sa * sb - sc.pow(2)
    t1 = ((sa * (g_y - p_y).pow(2) + sb * (g_x - p_x).pow(2)) / (det + eps)) * 0.25
    t2 = ((sc * (p_x - g_x) * (g_y - p_y)) / (det + eps)) * 0.5
    det_g = (g_a * g_b - g_c.pow(2)).clamp(min=0)
    det_p = (p_a * p_b - p_c.pow(2)).clamp(min=0)
    t3 = (det / (4 * (det_g * det_p).sqrt() + eps) + eps).log() * 0.5
    bhattacharyya = (t1 + t2 + t3).clamp(eps, 100.0)
    hellinger = (1.0 - (-bhattacharyya).exp() + eps).sqrt()
    return 1 - hellinger


def pair_overlaps(gt: torch.Tensor, pd: torch.Tensor, rules: str = DEFAULT_RULES) -> torch.Tensor:
    """Overlap of paired boxes, clamped below at 0: CIoU for (N, 4), probiou for (N, 5)."""
    overlap = ciou(gt, pd, classic=classic_ciou(rules)) if gt.shape[-1] == 4 else probiou(gt, pd)
    return overlap.clamp(min=0)


def _box_sides(gt_bboxes: torch.Tensor):
    """Width and height of x1y1x2y2 boxes as they are given (no side floor)."""
    return gt_bboxes[..., 2] - gt_bboxes[..., 0], gt_bboxes[..., 3] - gt_bboxes[..., 1]


def level_gate(inside: torch.Tensor, gt_bboxes: torch.Tensor, anc_strides: torch.Tensor,
               level_range=LEVEL_RANGE) -> torch.Tensor:
    """Step 1 for pose: of the (B, M, A) containment ``inside``, the anchors on the pyramid levels that fit each
    object's size; an object the gate would leave with none keeps all of ``inside``.

    The side is ``sqrt(max(w * h, 0))`` of the box as given; an anchor of stride t passes when ``side >= lo * t`` (or t
    is the smallest stride of all anchors) and ``side <= hi * t`` (or t is the largest), ``lo * t`` and ``hi * t``
    rounded to the strides' dtype and compared in the promoted dtype.
    """
    lo, hi = level_range
    w, h = _box_sides(gt_bboxes)
    side = (w * h).clamp(min=0).sqrt()[..., None]  # (B, M, 1)
    t = anc_strides
    low_ok = (side >= t * lo) | (t == t.min())
    high_ok = (side <= t * hi) | (t == t.max())
    gated = inside & low_ok & high_ok
    return torch.where(gated.any(-1, keepdim=True), gated, inside)


def keypoint_oks(gt_boxes: torch.Tensor, gt_kpts: torch.Tensor, pd_kpts: torch.Tensor, sigmas: torch.Tensor,
                 eps: float) -> torch.Tensor:
    """Object keypoint similarity of paired objects and predictions (P pairs): gt_boxes (P, 4), gt_kpts (P, K, 3)
    (x, y, visibility), pd_kpts (P, K, 2). Keypoints with visibility > 0 count; the mean of
    ``exp(-d^2 / ((2 sigma)^2 * (area * 0.53 + eps) * 2))`` over them, or 0 when none is visible (the caller keeps the
    box overlap for those). The predicted keypoints are rounded to float32 first."""
    vis = gt_kpts[..., 2] > 0
    w, h = _box_sides(gt_boxes)
    scale = (w * h)[:, None] * OKS_AREA_SCALE + eps  # (P, 1)
    d2 = (pd_kpts.float() - gt_kpts[..., :2]).pow(2).sum(-1)
    e = (-d2 / ((2 * sigmas).pow(2) * scale * 2)).exp() * vis
    return e.sum(-1) / vis.sum(-1).clamp(min=1)


class PoseInputs:
    """The pose assigner's extra inputs (docs/spec.md, "Pose"): per-anchor strides (A,), predicted keypoints
    (B, A, K, 2), object keypoints (B, M, K, 3), sigmas (K,) and the level range (lo, hi)."""

    def __init__(self, anc_strides, pd_kpts, gt_kpts, sigmas, level_range=LEVEL_RANGE):
        self.anc_strides, self.pd_kpts, self.gt_kpts, self.sigmas = anc_strides, pd_kpts, gt_kpts, sigmas
        self.level_range = tuple(level_range)

    def overlaps(self, b, m, a, gt_bboxes, box_overlap, eps, mean=False):
        """Step 2's overlap of the pairs (b, m, a): the OKS (``mean``: ``(box_overlap + OKS) / 2``), or
        ``box_overlap`` for objects without visible keypoints."""
        gk = self.gt_kpts[b, m]
        oks = keypoint_oks(gt_bboxes[b, m], gk, self.pd_kpts[b, a], self.sigmas, eps).to(box_overlap.dtype)
        if mean:
            oks = (box_overlap + oks) / 2
        return torch.where((gk[..., 2] > 0).any(-1), oks, box_overlap)


# Segmentation (docs/spec.md, "Segmentation"): each object's SEG_TOPK_FACTOR * topk best candidate pairs by box
# metric get a mask IoU; the masks are decoded in chunks of about SEG_CHUNK_PIXELS mask pixels.
SEG_TOPK_FACTOR = 3
SEG_CHUNK_PIXELS = 1 << 27


class SegInputs:
    """The segmentation assigner's extra inputs (docs/spec.md, "Segmentation"): mask coefficients (B, A, nm),
    per-image scales from box units to mask pixels (B, 1), prototypes (B, nm, mh, mw) and object masks
    (B, >= M, mh, mw), nonzero inside the object; ``topk`` is the assigner's (the rows choose 3 * topk pairs)."""

    def __init__(self, pd_coef, mask_scale, proto, gt_masks, topk):
        self.pd_coef, self.mask_scale, self.proto, self.gt_masks = pd_coef, mask_scale, proto, gt_masks
        self.topk = int(topk)

    def overlaps(self, b, m, a, score, box_overlap, pd_bboxes, shape, alpha, beta, eps):
        """Step 2's overlap of the candidate pairs (b, m, a): ``(box overlap + mask IoU) / 2``, the mask IoU being
        0 except for each object's ``min(3 * topk, A)`` best pairs by ``s^alpha * box_overlap^beta + eps`` over all A
        anchors (non-candidates counting 0; ties to the lower anchor)."""
        box_metric = torch.zeros(shape, dtype=box_overlap.dtype, device=box_overlap.device)
        box_metric[b, m, a] = score.pow(alpha) * box_overlap.pow(beta) + eps
        chosen = topk_mask(box_metric, min(SEG_TOPK_FACTOR * self.topk, shape[-1]))[b, m, a].nonzero().squeeze(1)
        mask_iou = torch.zeros_like(box_overlap)
        if len(chosen):
            mask_iou[chosen] = self.mask_ious(b[chosen], m[chosen], a[chosen], pd_bboxes).to(mask_iou.dtype)
        return (box_overlap + mask_iou) / 2

    def mask_ious(self, b, m, a, pd_bboxes):
        """IoU of object m's mask with the binarised predicted mask of anchor a, cropped to the predicted box, for
        the pairs (b, m, a) (as float32 counts: intersection / max(union, 1)).

        The decode is a matrix product whose rounding decides the sign of a pixel, so it is done exactly as the
        contract lays it out: each image's chosen anchors packed in increasing order into slots, the images by
        decreasing count (``argsort(descending=True)`` of the per-image counts), and one product
        ``coef[chunk, :n] @ proto[images].flatten(2)`` per chunk of images, n the chunk's largest count and a chunk
        holding ``max(1, SEG_CHUNK_PIXELS // (n * mh * mw))`` images."""
        n_img, n_anchor = pd_bboxes.shape[:2]
        proto, coef_in = self.proto, self.pd_coef
        mh, mw = proto.shape[-2:]
        anchor_key, pair_slot = (b * n_anchor + a).unique(return_inverse=True)  # sorted: by image, then anchor
        key_img, key_anchor = anchor_key // n_anchor, anchor_key % n_anchor
        per_image = torch.bincount(key_img, minlength=n_img)
        slot = torch.arange(len(anchor_key), device=b.device) - (per_image.cumsum(0) - per_image)[key_img]
        order = per_image.argsort(descending=True)
        place = order.argsort()[key_img]  # each chosen anchor's image position in `order`
        counts = per_image[order].tolist()
        coef = coef_in.new_zeros(n_img, counts[0], coef_in.shape[-1])
        coef[place, slot] = coef_in[key_img, key_anchor]
        boxes = pd_bboxes.new_zeros(n_img, counts[0], 4)
        boxes[place, slot] = pd_bboxes[key_img, key_anchor] * self.mask_scale.reshape(-1, 1)[key_img]
        cols = torch.arange(mw, device=b.device, dtype=boxes.dtype)
        rows = torch.arange(mh, device=b.device, dtype=boxes.dtype)
        gt_flat = self.gt_masks.flatten(2)
        ious = torch.zeros(len(b), dtype=torch.float32, device=b.device)
        pair_place, pair_slot = place[pair_slot], slot[pair_slot]
        start = 0
        while start < n_img and counts[start]:
            n = counts[start]
            stop = start + max(1, SEG_CHUNK_PIXELS // (n * mh * mw))
            decoded = (coef[start:stop, :n] @ proto[order[start:stop]].flatten(2)) > 0  # (images, n, mh * mw)
            pairs = ((pair_place >= start) & (pair_place < stop)).nonzero().squeeze(1)
            x1, y1, x2, y2 = boxes[pair_place[pairs], pair_slot[pairs]].unbind(-1)
            in_x = (cols >= x1[:, None]) & (cols < x2[:, None])  # (pairs, mw)
            in_y = (rows >= y1[:, None]) & (rows < y2[:, None])  # (pairs, mh)
            pred = decoded[pair_place[pairs] - start, pair_slot[pairs]].view(-1, mh, mw)
            pred = pred & in_y[:, :, None] & in_x[:, None, :]
            gt = gt_flat[b[pairs], m[pairs]] != 0
            inter = (pred.flatten(1) & gt).sum(-1)
            union = gt.sum(-1).float() + pred.flatten(1).sum(-1) - inter
            ious[pairs] = inter.float() / union.clamp(min=1)
            start = stop
        return ious


def box_metrics(
    pd_scores: torch.Tensor,
    pd_bboxes: torch.Tensor,
    gt_labels: torch.Tensor,
    gt_bboxes: torch.Tensor,
    candidates: torch.Tensor,
    alpha: float,
    beta: float,
    pose: PoseInputs | None = None,
    eps: float = 1e-9,
    seg: SegInputs | None = None,
    dense_metrics: bool = False,
    rules: str = DEFAULT_RULES,
):
    """Dense (B, M, A) ``align = s^alpha * o^beta`` and overlap ``o`` at candidate pairs, 0 elsewhere (step 2).

    ``dense_metrics``: take the power and product over the (B, M, A) tensors, as the peer's releases before 8.4.142
    do, instead of over the candidate pairs: the same values on CUDA; on the CPU a pair's ``pow`` can round differently
    by where it falls in a vector, and patch()'s self-check compares with those releases bit for bit this way.

    ``candidates`` is the (B, M, A) mask of pairs to evaluate (inside the region and a real object). With ``pose`` the
    overlap is the keypoint OKS (``eps`` is the assigner's, inside the OKS scale); with ``seg`` the mean of the box
    overlap and the mask IoU.
    """
    shape = candidates.shape
    b, m, a = candidates.nonzero(as_tuple=True)
    score = pd_scores[b, a, gt_labels[b, m, 0].long()]
    overlap = pair_overlaps(gt_bboxes[b, m], pd_bboxes[b, a], rules)
    if pose is not None:
        overlap = pose.overlaps(b, m, a, gt_bboxes, overlap, eps, pose_mean(rules))
    if seg is not None:
        overlap = seg.overlaps(b, m, a, score, overlap, pd_bboxes, shape, alpha, beta, eps)
    overlaps = torch.zeros(shape, dtype=pd_bboxes.dtype, device=pd_bboxes.device)
    overlaps[b, m, a] = overlap
    if dense_metrics:
        scores = torch.zeros(shape, dtype=pd_scores.dtype, device=pd_scores.device)
        scores[b, m, a] = score
        return scores.pow(alpha) * overlaps.pow(beta), overlaps
    align = score.pow(alpha) * overlap.pow(beta)
    align_metric = torch.zeros(shape, dtype=align.dtype, device=pd_scores.device)
    align_metric[b, m, a] = align
    return align_metric, overlaps


# ---------------------------------------------------------------------------------------------------------------
# Steps 3 and 5: top-k with ties to the lower index
# ---------------------------------------------------------------------------------------------------------------
def topk_mask(metric: torch.Tensor, k: int) -> torch.Tensor:
    """Bool mask of the k largest values along the last dim; ties go to the lower index, on every device.

    torch.topk's values do not depend on its tie order, so the k-th value is taken from it; then every element
    above it is kept and the elements equal to it are taken in index order until k are chosen. NaN ranks above
    every number (as in torch.topk) and NaNs tie with each other.
    """
    kth = torch.topk(metric, k, dim=-1).values[..., -1:]
    metric_nan, kth_nan = metric.isnan(), kth.isnan()
    above = (metric > kth) | (metric_nan & ~kth_nan)
    at_kth = (metric == kth) | (metric_nan & kth_nan)
    room = k - above.sum(-1, keepdim=True)
    return above | (at_kth & (at_kth.cumsum(-1) <= room))


# ---------------------------------------------------------------------------------------------------------------
# Step 4: conflicts
# ---------------------------------------------------------------------------------------------------------------
def resolve_conflicts(mask_pos: torch.Tensor, overlaps: torch.Tensor) -> torch.Tensor:
    """An anchor positive for several rows keeps only the row with the largest overlap over all M rows.

    Ties go to the lower row; the winning row need not have claimed the anchor (docs/spec.md, "conflicts look at
    every row").
    """
    multi = mask_pos.sum(1, keepdim=True) > 1  # (B, 1, A)
    best = overlaps.argmax(1, keepdim=True)  # (B, 1, A): the first maximum
    rows = torch.arange(mask_pos.shape[1], device=mask_pos.device)[None, :, None]
    return torch.where(multi, rows == best, mask_pos)


# ---------------------------------------------------------------------------------------------------------------
# Step 6: targets and normalised scores
# ---------------------------------------------------------------------------------------------------------------
def _targets(gt_labels, gt_bboxes, target_gt_idx, fg_mask, num_classes):
    bs, n_boxes = gt_bboxes.shape[:2]
    flat = target_gt_idx + torch.arange(bs, device=target_gt_idx.device)[:, None] * n_boxes
    target_labels = gt_labels.long().flatten()[flat].clamp(min=0)
    target_bboxes = gt_bboxes.reshape(-1, gt_bboxes.shape[-1])[flat]
    one_hot = torch.zeros((*target_labels.shape, num_classes), dtype=torch.int8, device=target_labels.device)
    one_hot.scatter_(2, target_labels[..., None], 1)
    one_hot = one_hot * fg_mask[..., None]
    return target_labels, target_bboxes, one_hot


def _empty_result(pd_scores, pd_bboxes, gt_bboxes, num_classes):
    bs, n_anchors = pd_scores.shape[:2]
    score_dtype = torch.promote_types(pd_scores.dtype, pd_bboxes.dtype)
    device = pd_scores.device
    return (
        torch.full((bs, n_anchors), num_classes, dtype=torch.long, device=device),
        torch.zeros((bs, n_anchors, gt_bboxes.shape[-1]), dtype=gt_bboxes.dtype, device=device),
        torch.zeros((bs, n_anchors, num_classes), dtype=score_dtype, device=device),
        torch.zeros((bs, n_anchors), dtype=torch.bool, device=device),
        torch.zeros((bs, n_anchors), dtype=torch.long, device=device),
    )


def check_labels(gt_labels: torch.Tensor, valid: torch.Tensor, num_classes: int) -> None:
    """Labels of real objects must lie in [0, num_classes). On the CPU a ValueError; on other devices, and under
    torch.compile, an assertion in the computation (torch._assert_async), which needs no host synchronisation and,
    when it fails on CUDA, surfaces as a device-side assert error at the next synchronisation (the CUDA context is
    then unusable)."""
    labels = gt_labels.reshape(valid.shape)
    bad = (labels < 0) | (labels >= num_classes)
    if labels.is_floating_point():
        bad |= labels.isnan()
    bad &= valid
    if labels.device.type == "cpu" and not torch.compiler.is_compiling():
        if bad.any():
            raise ValueError(f"gt_labels: real objects (mask_gt != 0) must have labels in [0, {num_classes}); found "
                             f"{labels[bad][:5].tolist()} (first five)")
    else:
        torch._assert_async(~bad.any(), "gt_labels: a real object has a label outside [0, num_classes)")


@torch.no_grad()
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
    pose: PoseInputs | None = None,
    seg: SegInputs | None = None,
    rules: str = DEFAULT_RULES,
    dense_metrics: bool = False,
):
    """Task-aligned assignment, HBB (last dim 4) or OBB (last dim 5), exactly as docs/spec.md describes; with
    ``pose`` (HBB only) the pose assignment: the level gate in step 1 and the keypoint OKS as the overlap; with ``seg``
    (HBB only) the segmentation assignment: the mean of box overlap and mask IoU as the overlap. ``rules``: the peer's
    rule set (RULE_SETS); ``dense_metrics``: see box_metrics.

    Returns ``(target_labels, target_bboxes, target_scores, fg_mask, target_gt_idx)``. Inputs are not modified.
    """
    check_rules(rules, topk, topk2)
    topk2 = topk2 or topk
    n_boxes = gt_bboxes.shape[1]
    if n_boxes == 0:
        return _empty_result(pd_scores, pd_bboxes, gt_bboxes, num_classes)
    valid = mask_gt.reshape(gt_bboxes.shape[:2]).bool()[..., None]  # (B, M, 1)
    check_labels(gt_labels, valid, num_classes)

    # Steps 1-3: candidates, metrics, top-k.
    stride = list(stride)
    inside = points_in_boxes(anc_points, gt_bboxes, mask_gt, stride_value(stride), rules, stride[0])
    if pose is not None and not pose_mean(rules):
        inside = level_gate(inside, gt_bboxes, pose.anc_strides, pose.level_range)
    align_metric, overlaps = box_metrics(pd_scores, pd_bboxes, gt_labels, gt_bboxes, inside & valid, alpha, beta,
                                         pose, eps, seg, dense_metrics, rules)
    mask_pos = topk_mask(align_metric, topk) & inside & valid

    # Steps 4-5: conflicts, then the second top-k over what each row owns.
    mask_pos = resolve_conflicts(mask_pos, overlaps)
    if topk2 != topk:
        mask_pos &= topk_mask(align_metric * mask_pos, topk2)

    # Step 6: foreground and targets,
    fg_mask = mask_pos.any(1)
    target_gt_idx = mask_pos.to(torch.uint8).argmax(1)
    target_labels, target_bboxes, one_hot = _targets(gt_labels, gt_bboxes, target_gt_idx, fg_mask, num_classes)

    # and the scores, normalised over the final positives.
    align_pos = align_metric * mask_pos
    best_align = align_pos.amax(-1, keepdim=True)
    best_overlap = (overlaps * mask_pos).amax(-1, keepdim=True)
    norm = align_pos.mul_(best_overlap).div_(best_align + eps).amax(-2)
    target_scores = one_hot * norm[..., None]
    return target_labels, target_bboxes, target_scores, fg_mask, target_gt_idx


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
    level_range=LEVEL_RANGE,
    **settings,
):
    """The pose assignment (docs/spec.md, "Pose"): ``assign`` for x1y1x2y2 boxes with the level gate and the keypoint
    OKS. ``settings`` are those of ``assign``."""
    return assign(pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt,
                  pose=PoseInputs(anc_strides, pd_kpts, gt_kpts, sigmas, level_range), **settings)


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
    **settings,
):
    """The segmentation assignment (docs/spec.md, "Segmentation"): ``assign`` for x1y1x2y2 boxes whose overlap is the
    mean of the box overlap and the mask IoU. ``settings`` are those of ``assign``."""
    return assign(pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt, topk=topk,
                  seg=SegInputs(pd_coef, mask_scale, proto, gt_masks, topk), **settings)
