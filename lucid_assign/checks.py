"""The input checks of the public API: the settings (Python values) and, where the reference runs, the tensors.

The kernel path is checked by the ops themselves (csrc/checks.h: ValueError or TypeError naming the argument); these
checks give the same messages where no op runs: on the reference path, and while torch.compile traces a call. Every
message names the argument and says what was wrong.
"""

from __future__ import annotations

import math
import operator
from typing import Sequence

import torch

from . import reference
from .reference import INPUTS, POSE_INPUTS, SEG_INPUTS


def shape_of(t: torch.Tensor) -> tuple:
    return tuple(t.shape)


def require_tensors(names: Sequence[str], tensors: Sequence) -> None:
    for name, t in zip(names, tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.layout != torch.strided:
            raise TypeError(f"{name} must be a dense (strided) tensor, got {t.layout}")


def integer(name: str, value) -> int:
    """``value`` as an int: an int, a NumPy integer or an integer tensor of one element; a bool, a float or anything
    else is a TypeError naming the argument (the op would truncate what the reference refuses)."""
    try:
        if isinstance(value, bool):
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {value!r}") from None


def count(name: str, value, alternatives: str) -> int:
    """``value`` as an int >= 0 (an int, a NumPy integer or a one-element integer tensor), else a ValueError naming
    the argument."""
    try:
        n = integer(name, value)
    except TypeError:
        n = -1
    if n < 0:
        raise ValueError(f"{name} must be an integer >= 0{alternatives}, got {value!r}")
    return n


def real(name: str, value) -> float:
    """``value`` as a float: a real number (a string is refused, not parsed)."""
    try:
        if isinstance(value, (str, bytes, complex)):
            raise TypeError
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a real number, got {value!r}") from None


def check_settings(*, topk, topk2, num_classes, alpha, beta, stride, eps, rules, level_range=None) -> None:
    """Raise ValueError or TypeError naming the argument for settings no backend takes (they are Python values: the
    op gets them converted, so their messages are given here)."""
    if integer("topk", topk) < 1:
        raise ValueError(f"topk must be >= 1, got {topk}")
    if topk2 is not None and integer("topk2", topk2) < 1:
        raise ValueError(f"topk2 must be >= 1 (or None for topk), got {topk2}")
    integer("num_classes", num_classes)
    real("alpha", alpha)
    real("beta", beta)
    try:
        stride = list(stride)
        ok = bool(stride) and all(math.isfinite(real("stride", s)) and float(s) > 0 for s in stride)
    except TypeError:
        ok = False
    if not ok:
        raise ValueError(f"stride must be a non-empty list of positive numbers, got {stride!r}")
    check_eps(eps)
    reference.check_rules(rules, topk, topk2)
    if level_range is not None:
        try:
            lo, hi = (float(v) for v in level_range)
        except (TypeError, ValueError):
            raise ValueError(f"level_range must be two numbers (lo, hi), got {level_range!r}") from None
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise ValueError(f"level_range must be two finite numbers, got {level_range!r}")


def check_eps(eps) -> None:
    """eps must be a positive number: step 6 divides by ``pa + eps``, and with eps <= 0 a row that owns nothing
    (pa = 0) divides 0 by 0 (docs/spec.md, "Inputs")."""
    try:
        ok = math.isfinite(float(eps)) and float(eps) > 0
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"eps must be a positive number, got {eps!r}")


BOX_DTYPES = (torch.float32, torch.float64)  # the boxes every backend takes (anchors may be narrower: widened exactly)
# The floating-point dtypes the API takes; torch also counts float8 and float4 as floating point, which none does.
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def require_float(name: str, t: torch.Tensor) -> None:
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be a float16, bfloat16, float32 or float64 tensor, got {t.dtype}")


def check_inputs(pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt, *, topk, topk2, num_classes, stride,
                 read_values=True):
    """Raise ValueError/TypeError naming the argument when the box inputs do not form a valid assignment problem
    (the reference path's checks; the op has the same). ``read_values=False`` leaves out the one check that reads
    tensor values (labels in range on the CPU)."""
    tensors = dict(zip(INPUTS, (pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt)))
    require_tensors(INPUTS, tensors.values())
    if pd_scores.dim() != 3:
        raise ValueError(f"pd_scores must be (B, A, C), got {shape_of(pd_scores)}")
    bs, n_anchors, n_cls = pd_scores.shape
    if gt_bboxes.dim() != 3 or gt_bboxes.shape[-1] not in (4, 5):
        raise ValueError(f"gt_bboxes must be (B, M, 4) or (B, M, 5), got {shape_of(gt_bboxes)}")
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
        if shape_of(t) != shape:
            raise ValueError(f"{name} must have shape {shape} (from pd_scores and gt_bboxes), got {shape_of(t)}")
    for name in ("pd_scores", "pd_bboxes", "anc_points", "gt_bboxes"):
        require_float(name, tensors[name])
    for name in ("pd_bboxes", "gt_bboxes"):
        if tensors[name].dtype not in BOX_DTYPES:
            raise TypeError(f"{name} must be float32 or float64, got {tensors[name].dtype}: half-precision boxes "
                            f"cannot hold pixel coordinates (11 significant bits) and their overlaps overflow to NaN "
                            f"(docs/odd-inputs.md). Pass {name}.float(), as the peer trainer's losses do")
    one_device(tensors)
    if n_cls != num_classes:
        raise ValueError(f"num_classes is {num_classes} but pd_scores has {n_cls} classes")
    if n_boxes > 0 and max(topk, topk2 or topk) > n_anchors:
        raise ValueError(f"topk ({topk}) and topk2 ({topk2}) must not exceed the number of anchors ({n_anchors})")
    if gt_labels.is_complex() or gt_labels.dtype == torch.bool or (gt_labels.is_floating_point()
                                                                   and gt_labels.dtype not in FLOAT_DTYPES):
        raise TypeError(f"gt_labels must hold class ids (integer, or float16 to float64), got {gt_labels.dtype}")
    if read_values and pd_scores.device.type == "cpu":  # values can be read without a device synchronisation
        reference.check_labels(gt_labels, mask_gt.reshape(gt_labels.shape[:2]).bool(), num_classes)


def one_device(tensors: dict) -> None:
    devices = {t.device for t in tensors.values()}
    if len(devices) > 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(str(d) for d in devices)}")


def check_pose_inputs(pd_scores, gt_bboxes, anc_strides, pd_kpts, gt_kpts, sigmas, level_range):
    """Raise ValueError/TypeError naming the argument when the pose inputs do not fit the box inputs (which
    check_inputs checked)."""
    tensors = dict(zip(POSE_INPUTS, (anc_strides, pd_kpts, gt_kpts, sigmas)))
    require_tensors(POSE_INPUTS, tensors.values())
    for name, t in tensors.items():
        require_float(name, t)
    if gt_bboxes.shape[-1] != 4:
        raise ValueError(f"the pose assignment takes x1y1x2y2 boxes: gt_bboxes must be (B, M, 4), got "
                         f"{shape_of(gt_bboxes)}")
    bs, n_anchors = pd_scores.shape[:2]
    n_boxes = gt_bboxes.shape[1]
    if gt_kpts.dim() != 4 or shape_of(gt_kpts)[:2] != (bs, n_boxes) or gt_kpts.shape[3] != 3:
        raise ValueError(f"gt_kpts must be (B, M, K, 3) = ({bs}, {n_boxes}, K, 3), got {shape_of(gt_kpts)}")
    n_kpts = gt_kpts.shape[2]
    if shape_of(pd_kpts) != (bs, n_anchors, n_kpts, 2):
        raise ValueError(f"pd_kpts must have shape {(bs, n_anchors, n_kpts, 2)} (from pd_scores and gt_kpts), got "
                         f"{shape_of(pd_kpts)}")
    if shape_of(sigmas) != (n_kpts,):
        raise ValueError(f"sigmas must have shape ({n_kpts},) (from gt_kpts), got {shape_of(sigmas)}")
    if shape_of(anc_strides) != (n_anchors,):
        raise ValueError(f"anc_strides must have shape ({n_anchors},) (from pd_scores), got {shape_of(anc_strides)}")
    one_device(dict(tensors, pd_scores=pd_scores))


def check_seg_inputs(pd_scores, gt_bboxes, pd_coef, mask_scale, proto, gt_masks):
    """Raise ValueError/TypeError naming the argument when the mask inputs do not fit the box inputs (which
    check_inputs checked)."""
    tensors = dict(zip(SEG_INPUTS, (pd_coef, mask_scale, proto, gt_masks)))
    require_tensors(SEG_INPUTS, tensors.values())
    for name in ("pd_coef", "mask_scale", "proto"):
        require_float(name, tensors[name])
    if gt_masks.is_complex():
        raise TypeError(f"gt_masks must be bool or real (nonzero: inside the object), got {gt_masks.dtype}")
    if gt_bboxes.shape[-1] != 4:
        raise ValueError(f"the segmentation assignment takes x1y1x2y2 boxes: gt_bboxes must be (B, M, 4), got "
                         f"{shape_of(gt_bboxes)}")
    bs, n_anchors = pd_scores.shape[:2]
    n_boxes = gt_bboxes.shape[1]
    if proto.dim() != 4 or proto.shape[0] != bs:
        raise ValueError(f"proto must be (B, nm, mh, mw) with B = {bs}, got {shape_of(proto)}")
    nm, mh, mw = proto.shape[1:]
    if shape_of(pd_coef) != (bs, n_anchors, nm):
        raise ValueError(f"pd_coef must have shape {(bs, n_anchors, nm)} (from pd_scores and proto), got "
                         f"{shape_of(pd_coef)}")
    if shape_of(mask_scale) not in ((bs, 1), (bs,)):
        raise ValueError(f"mask_scale must have shape ({bs}, 1), got {shape_of(mask_scale)}")
    if (gt_masks.dim() != 4 or gt_masks.shape[0] != bs or gt_masks.shape[1] < n_boxes
            or shape_of(gt_masks)[2:] != (mh, mw)):
        raise ValueError(f"gt_masks must be (B, >= M, mh, mw) = ({bs}, >= {n_boxes}, {mh}, {mw}) (from gt_bboxes and "
                         f"proto), got {shape_of(gt_masks)}")
    one_device(dict(tensors, pd_scores=pd_scores))
    if pd_coef.dtype != proto.dtype and not autocast_on(pd_coef):
        raise TypeError(f"pd_coef and proto must have one dtype outside autocast (their product decodes the masks), "
                        f"got {pd_coef.dtype} and {proto.dtype}")


def autocast_on(t: torch.Tensor) -> bool:
    kind = t.device.type
    return kind in ("cuda", "cpu") and torch.is_autocast_enabled(kind)


# ---- the linear sum assignment's inputs --------------------------------------------------------------------------


def check_lsap_inputs(cost, sizes) -> None:
    """Raise ValueError/TypeError naming the argument for a cost or sizes no backend takes (the reference path's
    checks; the op has the same, csrc/checks.h)."""
    require_tensors(("cost",), (cost,))
    if cost.dim() not in (2, 3):
        raise ValueError(f"cost must be a matrix (R, C) or a batch of them (B, R, C), got {cost.dim()} dimensions "
                         f"{shape_of(cost)}")
    if cost.dtype not in FLOAT_DTYPES:
        raise TypeError(f"cost must be float32 or float64 (float16 and bfloat16 are widened exactly), got {cost.dtype}")
    if sizes is None:
        return
    if cost.dim() != 3:
        raise ValueError(f"sizes applies to a batch of costs (B, R, C); cost is a matrix {shape_of(cost)}")
    if sizes.dtype == torch.bool or sizes.is_floating_point() or sizes.is_complex():
        raise TypeError(f"sizes must hold integers (the valid columns of each problem), got {sizes.dtype}")
    if shape_of(sizes) != shape_of(cost)[:1]:
        raise ValueError(f"sizes must be (B,) = ({cost.shape[0]},), one per problem, got {shape_of(sizes)}")
    if sizes.device != cost.device and sizes.device.type != "cpu":
        raise ValueError(f"sizes must be on the CPU or on the device of cost ({cost.device}), got {sizes.device}")
    if sizes.device.type == "cpu":
        n_cols = cost.shape[2]
        for b, n in enumerate(sizes.tolist()):
            if not 0 <= n <= n_cols:
                raise ValueError(f"sizes[{b}] must be in [0, C] = [0, {n_cols}], got {n}")


def sizes_tensor(sizes) -> torch.Tensor:
    """``sizes`` given as a sequence (a list, a tuple, a NumPy array), as an int64 tensor on the CPU; every element
    an integer (a bool, a float or anything else is refused, not truncated)."""
    try:
        values = list(sizes)
    except TypeError:
        raise TypeError(f"sizes must be B integers (a list or a tensor), got {type(sizes).__name__}") from None
    for b, n in enumerate(values):
        try:
            values[b] = integer(f"sizes[{b}]", n)
        except TypeError:
            raise TypeError(f"sizes must hold integers (the valid columns of each problem), got sizes[{b}] = "
                            f"{n!r}") from None
        if not -(2**63) <= values[b] < 2**63:
            raise ValueError(f"sizes[{b}] must be in [0, C], got {values[b]}")
    return torch.tensor(values, dtype=torch.long)

