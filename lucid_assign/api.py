"""The public functional form of the assignment, and the one dispatch behind it: the choice of backend.

Backends: ``"kernel"`` (the compiled ops torch.ops.lucid.assign, assign_pose and assign_seg), ``"reference"`` (the
pure-PyTorch assigner of lucid_assign.reference) and ``"auto"`` (the kernel when the library is loaded, has a kernel
for the tensors' device and supports their dtypes; otherwise the reference, saying once why). The environment
variable ``LUCID_ASSIGN_BACKEND`` (auto | kernel | reference), when set, overrides the argument.

Checks. The settings (topk, stride, eps, rules, ...) are checked here, where a message names the Python argument. The
tensors are checked once: by the op on the kernel path (csrc/checks.h: ValueError or TypeError naming the argument),
by check_inputs here on the reference path, which has no checks of its own, and while torch.compile traces a call.
"""

from __future__ import annotations

import math
import operator
import os
import sys
import warnings
from typing import Callable, NamedTuple, Sequence

import torch

from . import _library, lsap, ops, reference
from .reference import INPUTS, POSE_INPUTS, SEG_INPUTS

BACKENDS = ("auto", "kernel", "reference")
ENV_BACKEND = "LUCID_ASSIGN_BACKEND"
_warned: set = set()


class FallbackWarning(UserWarning):
    """A call goes to a slower path than the one asked for: ``backend="auto"`` runs the reference (the functional API
    and the drop-in modules) or the peer's own assigner (the patched peer trainer) because the kernel cannot take its
    tensors. The message says why and what to do. Filter it as any warning, e.g.
    ``warnings.simplefilter("ignore", lucid_assign.FallbackWarning)``."""


_OWN_FILES = (os.path.dirname(os.path.abspath(__file__)) + os.sep, os.path.dirname(torch.__file__) + os.sep)


def warn_caller(message: str, category: type = FallbackWarning) -> None:
    """warnings.warn at the first frame outside lucid-assign and torch (the line that called the assigner), so that
    the warning names the caller's file and line and the warnings filters apply to it."""
    frame, level = sys._getframe(0), 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_OWN_FILES):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


class Reason(str):
    """Why the kernel cannot take a call (the string), with ``fix``: what to do about it."""

    fix: str

    def __new__(cls, why: str, fix: str):
        self = super().__new__(cls, why)
        self.fix = fix
        return self


# ---- checks ----------------------------------------------------------------------------------------------------


def _shape(t: torch.Tensor) -> tuple:
    return tuple(t.shape)


def _require_tensors(names: Sequence[str], tensors: Sequence) -> None:
    for name, t in zip(names, tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.layout != torch.strided:
            raise TypeError(f"{name} must be a dense (strided) tensor, got {t.layout}")


def _integer(name: str, value) -> int:
    """``value`` as an int: an int, a NumPy integer or an integer tensor of one element; a bool, a float or anything
    else is a TypeError naming the argument (the op would truncate what the reference refuses)."""
    try:
        if isinstance(value, bool):
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {value!r}") from None


def _count(name: str, value, alternatives: str) -> int:
    """``value`` as an int >= 0 (an int, a NumPy integer or a one-element integer tensor), else a ValueError naming
    the argument."""
    try:
        n = _integer(name, value)
    except TypeError:
        n = -1
    if n < 0:
        raise ValueError(f"{name} must be an integer >= 0{alternatives}, got {value!r}")
    return n


def _real(name: str, value) -> float:
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
    if _integer("topk", topk) < 1:
        raise ValueError(f"topk must be >= 1, got {topk}")
    if topk2 is not None and _integer("topk2", topk2) < 1:
        raise ValueError(f"topk2 must be >= 1 (or None for topk), got {topk2}")
    _integer("num_classes", num_classes)
    _real("alpha", alpha)
    _real("beta", beta)
    try:
        stride = list(stride)
        ok = bool(stride) and all(math.isfinite(_real("stride", s)) and float(s) > 0 for s in stride)
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


def _require_float(name: str, t: torch.Tensor) -> None:
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be a float16, bfloat16, float32 or float64 tensor, got {t.dtype}")


def check_inputs(pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt, *, topk, topk2, num_classes, stride,
                 read_values=True):
    """Raise ValueError/TypeError naming the argument when the box inputs do not form a valid assignment problem
    (the reference path's checks; the op has the same). ``read_values=False`` leaves out the one check that reads
    tensor values (labels in range on the CPU)."""
    tensors = dict(zip(INPUTS, (pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt)))
    _require_tensors(INPUTS, tensors.values())
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
        _require_float(name, tensors[name])
    for name in ("pd_bboxes", "gt_bboxes"):
        if tensors[name].dtype not in BOX_DTYPES:
            raise TypeError(f"{name} must be float32 or float64, got {tensors[name].dtype}: half-precision boxes "
                            f"cannot hold pixel coordinates (11 significant bits) and their overlaps overflow to NaN "
                            f"(docs/odd-inputs.md). Pass {name}.float(), as the peer trainer's losses do")
    _one_device(tensors)
    if n_cls != num_classes:
        raise ValueError(f"num_classes is {num_classes} but pd_scores has {n_cls} classes")
    if n_boxes > 0 and max(topk, topk2 or topk) > n_anchors:
        raise ValueError(f"topk ({topk}) and topk2 ({topk2}) must not exceed the number of anchors ({n_anchors})")
    if gt_labels.is_complex() or gt_labels.dtype == torch.bool or (gt_labels.is_floating_point()
                                                                   and gt_labels.dtype not in FLOAT_DTYPES):
        raise TypeError(f"gt_labels must hold class ids (integer, or float16 to float64), got {gt_labels.dtype}")
    if read_values and pd_scores.device.type == "cpu":  # values can be read without a device synchronisation
        reference.check_labels(gt_labels, mask_gt.reshape(gt_labels.shape[:2]).bool(), num_classes)


def _one_device(tensors: dict) -> None:
    devices = {t.device for t in tensors.values()}
    if len(devices) > 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(str(d) for d in devices)}")


def check_pose_inputs(pd_scores, gt_bboxes, anc_strides, pd_kpts, gt_kpts, sigmas, level_range):
    """Raise ValueError/TypeError naming the argument when the pose inputs do not fit the box inputs (which
    check_inputs checked)."""
    tensors = dict(zip(POSE_INPUTS, (anc_strides, pd_kpts, gt_kpts, sigmas)))
    _require_tensors(POSE_INPUTS, tensors.values())
    for name, t in tensors.items():
        _require_float(name, t)
    if gt_bboxes.shape[-1] != 4:
        raise ValueError(f"the pose assignment takes x1y1x2y2 boxes: gt_bboxes must be (B, M, 4), got "
                         f"{_shape(gt_bboxes)}")
    bs, n_anchors = pd_scores.shape[:2]
    n_boxes = gt_bboxes.shape[1]
    if gt_kpts.dim() != 4 or _shape(gt_kpts)[:2] != (bs, n_boxes) or gt_kpts.shape[3] != 3:
        raise ValueError(f"gt_kpts must be (B, M, K, 3) = ({bs}, {n_boxes}, K, 3), got {_shape(gt_kpts)}")
    n_kpts = gt_kpts.shape[2]
    if _shape(pd_kpts) != (bs, n_anchors, n_kpts, 2):
        raise ValueError(f"pd_kpts must have shape {(bs, n_anchors, n_kpts, 2)} (from pd_scores and gt_kpts), got "
                         f"{_shape(pd_kpts)}")
    if _shape(sigmas) != (n_kpts,):
        raise ValueError(f"sigmas must have shape ({n_kpts},) (from gt_kpts), got {_shape(sigmas)}")
    if _shape(anc_strides) != (n_anchors,):
        raise ValueError(f"anc_strides must have shape ({n_anchors},) (from pd_scores), got {_shape(anc_strides)}")
    _one_device(dict(tensors, pd_scores=pd_scores))


def check_seg_inputs(pd_scores, gt_bboxes, pd_coef, mask_scale, proto, gt_masks):
    """Raise ValueError/TypeError naming the argument when the mask inputs do not fit the box inputs (which
    check_inputs checked)."""
    tensors = dict(zip(SEG_INPUTS, (pd_coef, mask_scale, proto, gt_masks)))
    _require_tensors(SEG_INPUTS, tensors.values())
    for name in ("pd_coef", "mask_scale", "proto"):
        _require_float(name, tensors[name])
    if gt_masks.is_complex():
        raise TypeError(f"gt_masks must be bool or real (nonzero: inside the object), got {gt_masks.dtype}")
    if gt_bboxes.shape[-1] != 4:
        raise ValueError(f"the segmentation assignment takes x1y1x2y2 boxes: gt_bboxes must be (B, M, 4), got "
                         f"{_shape(gt_bboxes)}")
    bs, n_anchors = pd_scores.shape[:2]
    n_boxes = gt_bboxes.shape[1]
    if proto.dim() != 4 or proto.shape[0] != bs:
        raise ValueError(f"proto must be (B, nm, mh, mw) with B = {bs}, got {_shape(proto)}")
    nm, mh, mw = proto.shape[1:]
    if _shape(pd_coef) != (bs, n_anchors, nm):
        raise ValueError(f"pd_coef must have shape {(bs, n_anchors, nm)} (from pd_scores and proto), got "
                         f"{_shape(pd_coef)}")
    if _shape(mask_scale) not in ((bs, 1), (bs,)):
        raise ValueError(f"mask_scale must have shape ({bs}, 1), got {_shape(mask_scale)}")
    if (gt_masks.dim() != 4 or gt_masks.shape[0] != bs or gt_masks.shape[1] < n_boxes
            or _shape(gt_masks)[2:] != (mh, mw)):
        raise ValueError(f"gt_masks must be (B, >= M, mh, mw) = ({bs}, >= {n_boxes}, {mh}, {mw}) (from gt_bboxes and "
                         f"proto), got {_shape(gt_masks)}")
    _one_device(dict(tensors, pd_scores=pd_scores))
    if pd_coef.dtype != proto.dtype and not _autocast_on(pd_coef):
        raise TypeError(f"pd_coef and proto must have one dtype outside autocast (their product decodes the masks), "
                        f"got {pd_coef.dtype} and {proto.dtype}")


def _autocast_on(t: torch.Tensor) -> bool:
    kind = t.device.type
    return kind in ("cuda", "cpu") and torch.is_autocast_enabled(kind)


# ---- what the kernels take -------------------------------------------------------------------------------------


def _widens_exactly(narrow: torch.dtype, wide: torch.dtype) -> bool:
    return narrow == wide or (narrow in FLOAT_DTYPES and wide in FLOAT_DTYPES
                               and torch.promote_types(narrow, wide) == wide)


def device_unsupported(device: str, op: str = "assign") -> Reason | None:
    """Why the compiled ``op`` cannot run on tensors of this device type at all, or None when it can."""
    if not _library.loaded():
        return Reason(f"the compiled library is not loaded ({_library.LOAD_ERROR})", _library.LOAD_FIX)
    if device not in ("cpu", "cuda") or not _library.has_kernel(op, device):
        return Reason(f"the compiled library has no {op} kernel for {device} tensors", _rebuild_fix(device))
    return None


def _rebuild_fix(device: str) -> str:
    if device == "cuda":
        return ("build lucid-assign with its CUDA kernels (needs nvcc and a CUDA build of torch): FORCE_CUDA=1 pip "
                "install --force-reinstall --no-deps --no-cache-dir lucid-assign")
    return f"run the assignment on CPU or CUDA tensors, not {device}"


def _box_unsupported(device, score_dtype, pd_dtype, anchor_dtype, box_dtype) -> Reason | None:
    why = device_unsupported(device)
    if why:
        return why
    allowed = (torch.float32, torch.float64) if device == "cpu" else (torch.float32,)
    if box_dtype not in allowed:
        return Reason(f"the {device} kernel takes {' or '.join(str(d) for d in allowed)} boxes, got {box_dtype}",
                      "pass float32 boxes (gt_bboxes and pd_bboxes) and anchors" + (
                          "; float64 runs on the CPU kernel, or on the reference on CUDA" if device == "cuda" else ""))
    if pd_dtype != box_dtype or not _widens_exactly(anchor_dtype, box_dtype):
        return Reason(f"the kernel needs pd_bboxes of the dtype of gt_bboxes and anc_points of it or a narrower float "
                      f"type, got {pd_dtype}, {anchor_dtype} and {box_dtype}",
                      f"pass pd_bboxes and anc_points as {box_dtype}, the dtype of gt_bboxes")
    score_ok = (torch.float32, torch.float16, torch.bfloat16) if box_dtype == torch.float32 else (torch.float64,)
    if score_dtype not in score_ok:
        return Reason(f"the kernel takes {'/'.join(str(d) for d in score_ok)} scores with {box_dtype} boxes, got "
                      f"{score_dtype}", f"pass pd_scores as {score_ok[0]} with {box_dtype} boxes")
    return None


def _pose_unsupported(device, box_dtype, strides_dtype, pd_kpts_dtype, gt_kpts_dtype, sigmas_dtype,
                      n_kpts) -> Reason | None:
    if not _library.has_kernel("assign_pose", device):
        return Reason(f"the compiled library has no assign_pose kernel for {device} tensors", _rebuild_fix(device))
    most = _library.limit("MAX_KEYPOINTS")
    if n_kpts > most:
        return Reason(f"the kernels take at most {most} keypoints per object, got {n_kpts}",
                      "none is needed for the results, which are the same; for speed, use at most "
                      f"{most} keypoints, or pass backend='reference' to choose the reference without this warning")
    if gt_kpts_dtype != box_dtype or sigmas_dtype != box_dtype:
        return Reason(f"the kernel needs gt_kpts and sigmas of the dtype of gt_bboxes ({box_dtype}), got "
                      f"{gt_kpts_dtype} and {sigmas_dtype}", f"pass gt_kpts and sigmas as {box_dtype}")
    if not _widens_exactly(strides_dtype, box_dtype):
        return Reason(f"the kernel needs anc_strides of the dtype of gt_bboxes or a narrower float type, got "
                      f"{strides_dtype}", f"pass anc_strides as {box_dtype}")
    return None


def _seg_unsupported(device, box_dtype, scale_dtype, pixels) -> Reason | None:
    if not _library.has_kernel("assign_seg", device):
        return Reason(f"the compiled library has no assign_seg kernel for {device} tensors", _rebuild_fix(device))
    if scale_dtype not in (torch.float32, torch.float64):
        return Reason(f"the kernel takes a float32 or float64 mask_scale, got {scale_dtype}",
                      "pass mask_scale as float32 (mask_scale.float())")
    most = _library.limit("MAX_MASK_PIXELS")
    if pixels > most:
        return Reason(f"the kernels take masks of at most {most} pixels (exact float32 counts), got {pixels}",
                      "none is needed for the results, which are the same; for speed, use smaller masks")
    return None


class _Task(NamedTuple):
    """What the three entry points differ in; the dispatch (dispatch) is one."""

    name: str  # of the op (torch.ops.lucid.<name>, ops.<name>) and of the reference's function (reference.<name>)
    extra_names: tuple  # the inputs after the six box inputs
    check_extra: Callable | None  # (pd_scores, gt_bboxes, *extra, **task settings) -> None
    support_key: Callable | None  # (*extra) -> what the kernel's support of the extra inputs depends on
    extra_unsupported: Callable | None  # (device, box dtype, *support key) -> Reason | None


def _pose_support_key(anc_strides, pd_kpts, gt_kpts, sigmas) -> tuple:
    n_kpts = gt_kpts.shape[2] if gt_kpts.dim() == 4 else 0  # a bad shape is the op's to report
    return anc_strides.dtype, pd_kpts.dtype, gt_kpts.dtype, sigmas.dtype, n_kpts


def _seg_support_key(pd_coef, mask_scale, proto, gt_masks) -> tuple:
    pixels = proto.shape[-2] * proto.shape[-1] if proto.dim() == 4 else 0
    return mask_scale.dtype, pixels


_BOX = _Task("assign", (), None, None, None)
_POSE = _Task("assign_pose", POSE_INPUTS,
              lambda s, g, *extra, level_range: check_pose_inputs(s, g, *extra, level_range), _pose_support_key,
              _pose_unsupported)
_SEG = _Task("assign_seg", SEG_INPUTS, lambda s, g, *extra: check_seg_inputs(s, g, *extra), _seg_support_key,
             _seg_unsupported)
TASKS = {t.name: t for t in (_BOX, _POSE, _SEG)}

_unsupported: dict = {}  # support key -> Reason | None


def _support_key(task: _Task, box, extra) -> tuple:
    """What the kernel's support of a call depends on: the op, the device type, the dtypes and the sizes the kernels
    limit (their shapes otherwise are the op's to check)."""
    pd_scores, pd_bboxes, anc_points, _, gt_bboxes, _ = box
    key = (task.name, pd_scores.device.type, pd_scores.dtype, pd_bboxes.dtype, anc_points.dtype, gt_bboxes.dtype)
    return key if task.support_key is None else key + task.support_key(*extra)


def _reason(key: tuple) -> Reason | None:
    """Why the op cannot take calls of this support key, or None; asked once per key."""
    if key not in _unsupported:
        why = _box_unsupported(*key[1:6])
        extra_unsupported = TASKS[key[0]].extra_unsupported
        if why is None and extra_unsupported is not None:
            why = extra_unsupported(key[1], key[5], *key[6:])
        _unsupported[key] = why
    return _unsupported[key]


def unsupported(task: str, box: Sequence[torch.Tensor], extra: Sequence[torch.Tensor] = ()) -> Reason | None:
    """Why the compiled op ``task`` ("assign", "assign_pose" or "assign_seg") cannot take these tensors (``box``: the
    six box inputs, ``extra``: the pose or mask inputs), or None when it can."""
    return _reason(_support_key(TASKS[task], box, extra))


def kernel_unsupported(pd_scores, pd_bboxes, anc_points, gt_bboxes) -> Reason | None:
    """Why the compiled assign cannot take these box inputs, or None when it can."""
    return unsupported("assign", (pd_scores, pd_bboxes, anc_points, None, gt_bboxes, None))


def kernel_fix(device: str, why: str) -> str:
    """What to do so that the kernel runs, for a reason given by unsupported()."""
    return getattr(why, "fix", None) or "see docs/odd-inputs.md for what each backend takes"


def resolve_backend(backend: str) -> str:
    """``backend``, or ``LUCID_ASSIGN_BACKEND`` when set, checked."""
    forced = os.environ.get(ENV_BACKEND)
    if forced:
        if forced not in BACKENDS:
            raise ValueError(f"{ENV_BACKEND} must be one of {BACKENDS}, got {forced!r}")
        backend = forced
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return backend


# ---- the dispatch ----------------------------------------------------------------------------------------------


def _check_all(task: _Task, box, extra, settings: dict, task_settings: dict, read_values: bool) -> None:
    check_inputs(*box, topk=settings["topk"], topk2=settings["topk2"], num_classes=settings["num_classes"],
                 stride=settings["stride"], read_values=read_values)
    if task.check_extra is not None:
        task.check_extra(box[0], box[4], *extra, **task_settings)


def _choose(task: _Task, box, extra, settings: dict, task_settings: dict, backend: str,
            on_unsupported: Callable | None = None) -> str:
    """"kernel" or "reference", or what ``on_unsupported(why)`` returns for a call the kernel cannot take under
    "auto" (the patched peer trainer hands it to the peer's own assigner). Every tensor is checked here unless the
    kernel takes the call: the op checks them then."""
    backend = resolve_backend(backend)
    why = None
    if backend != "reference":
        _require_tensors(INPUTS + task.extra_names, (*box, *extra))
        why = _reason(_support_key(task, box, extra))
        if why is None:
            return "kernel"
    _check_all(task, box, extra, settings, task_settings, read_values=True)
    if backend == "reference":
        return "reference"
    if on_unsupported is not None and backend == "auto":
        return on_unsupported(why)
    return _fallback(backend, why, box[0].device.type)


def _fallback(backend: str, why: Reason, device: str) -> str:
    if backend == "kernel":
        raise RuntimeError(f"backend='kernel' cannot run: {why}")
    if why not in _warned:  # say it once per reason: users hate silent slow paths
        _warned.add(why)
        warn_caller(f"lucid_assign: falling back to the pure-PyTorch reference assigner: {why}. Fix: "
                    f"{kernel_fix(device, why)}")
    return "reference"


def _choice_for(backend: str, key: tuple) -> str:
    """The choice for a call of this support key whose tensors passed their checks."""
    backend = resolve_backend(backend)
    if backend == "reference":
        return "reference"
    why = _reason(key)
    return "kernel" if why is None else _fallback(backend, why, key[1])


# torch.compile traces the choice as its result: it reads the environment, the library's registrations and a cache,
# which the graph does not need to see (they are settled before the first call).
_traced_choice = torch.compiler.assume_constant_result(_choice_for)


def dispatch(task: _Task, box, extra, settings: dict, task_settings: dict, backend: str,
             on_unsupported: Callable | None = None):
    """The one dispatch of assign, assign_pose and assign_seg: the settings checked, the backend chosen, the call
    run. With ``on_unsupported``, a call the kernel cannot take under "auto" returns ``on_unsupported(why)`` (None
    then: the caller runs it elsewhere)."""
    check_settings(**{k: settings[k] for k in ("topk", "topk2", "num_classes", "alpha", "beta", "stride", "eps",
                                               "rules")}, **task_settings)
    if torch.compiler.is_compiling():
        _check_all(task, box, extra, settings, task_settings, read_values=False)
        choice = _traced_choice(backend, _support_key(task, box, extra))
    else:
        choice = _choose(task, box, extra, settings, task_settings, backend, on_unsupported)
    stride = list(settings["stride"])
    kw = dict(topk=settings["topk"], topk2=settings["topk2"], num_classes=settings["num_classes"],
              alpha=settings["alpha"], beta=settings["beta"], eps=settings["eps"], rules=settings["rules"])
    if choice == "kernel":
        # anchors of a narrower float type (bf16 under autocast, as the peer trainer makes them) are widened by the
        # kernel: exact, and what the reference's type promotion does in every operation
        return getattr(ops, task.name)(*box, *extra, stride_val=reference.stride_value(stride),
                                       first_stride=stride[0], **kw, **task_settings)
    if choice == "reference":
        return getattr(reference, task.name)(*box, *extra, stride=stride, **kw, **task_settings)
    return None


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
        backend: "auto", "kernel" or "reference" (see the module docstring).
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
    return dispatch(_BOX, box, (), settings, {}, backend)


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
    return dispatch(_POSE, box, pose, settings, dict(level_range=level_range), backend)


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
    return dispatch(_SEG, box, (pd_coef, mask_scale, proto, gt_masks), settings, {}, backend)


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
    _require_tensors(("targets",), (targets,))
    if targets.dim() != 2 or targets.shape[1] not in (6, 7):
        raise ValueError(f"targets must be (N, 6) or (N, 7) rows of image index, class and box, got {_shape(targets)}")
    _require_float("targets", targets)
    batch_size = _count("batch_size", batch_size, "")
    if max_objects is not None:
        max_objects = _count("max_objects", max_objects, " or None")
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


# ---- the linear sum assignment -----------------------------------------------------------------------------------


def check_lsap_inputs(cost, sizes) -> None:
    """Raise ValueError/TypeError naming the argument for a cost or sizes no backend takes (the reference path's
    checks; the op has the same, csrc/checks.h)."""
    _require_tensors(("cost",), (cost,))
    if cost.dim() not in (2, 3):
        raise ValueError(f"cost must be a matrix (R, C) or a batch of them (B, R, C), got {cost.dim()} dimensions "
                         f"{_shape(cost)}")
    if cost.dtype not in FLOAT_DTYPES:
        raise TypeError(f"cost must be float32 or float64 (float16 and bfloat16 are widened exactly), got {cost.dtype}")
    if sizes is None:
        return
    if cost.dim() != 3:
        raise ValueError(f"sizes applies to a batch of costs (B, R, C); cost is a matrix {_shape(cost)}")
    if sizes.dtype == torch.bool or sizes.is_floating_point() or sizes.is_complex():
        raise TypeError(f"sizes must hold integers (the valid columns of each problem), got {sizes.dtype}")
    if _shape(sizes) != _shape(cost)[:1]:
        raise ValueError(f"sizes must be (B,) = ({cost.shape[0]},), one per problem, got {_shape(sizes)}")
    if sizes.device != cost.device and sizes.device.type != "cpu":
        raise ValueError(f"sizes must be on the CPU or on the device of cost ({cost.device}), got {sizes.device}")
    if sizes.device.type == "cpu":
        n_cols = cost.shape[2]
        for b, n in enumerate(sizes.tolist()):
            if not 0 <= n <= n_cols:
                raise ValueError(f"sizes[{b}] must be in [0, C] = [0, {n_cols}], got {n}")


def _lsap_choice(backend: str, device: str) -> str:
    """"kernel" or "reference" for a matching on this device type (a FallbackWarning, or an error for "kernel",
    where the kernel cannot run)."""
    backend = resolve_backend(backend)
    if backend == "reference":
        return backend
    why = device_unsupported(device, "linear_sum_assignment")
    return "kernel" if why is None else _fallback(backend, why, device)


def raise_unsolved(info: torch.Tensor) -> None:
    """ValueError with SciPy's words for the first problem the op did not solve (``info``, its third output). It reads
    ``info``: on CUDA, one synchronisation."""
    codes = info.reshape(-1).tolist()
    for b, code in enumerate(codes):
        if code:
            message = lsap.INFO_MESSAGES[code].format(b=b)
            raise ValueError(message if info.dim() == 0 or code == lsap.BAD_SIZE else f"cost[{b}]: {message}")


def linear_sum_assignment(cost: torch.Tensor, sizes=None, *, maximize: bool = False, backend: str = "auto",
                          check: bool = True):
    """The linear sum assignment (Hungarian matching): ``scipy.optimize.linear_sum_assignment`` on each problem, its
    choice exactly, ties included (docs/spec.md, "Linear sum assignment"), on the device of ``cost``.

    Args:
        cost: (R, C) or a batch (B, R, C) of costs, float32 or float64 (float16 and bfloat16 are widened exactly;
            integer, bool and float8 costs are read as float64, as SciPy reads them); +inf forbids a pair, NaN and -inf
            are refused.
        sizes: for a batch, the valid columns of each problem (problem b is ``cost[b, :, :sizes[b]]``, e.g. each
            image's objects): B integers, a list or a tensor on the CPU or on the device of ``cost``; None: all C.
        maximize: match for the largest total, as SciPy's ``maximize=True``: the problem of the negated cost (so
            -inf forbids a pair and +inf is refused).
        backend: "auto" (the compiled op where it has a kernel for the device, else the reference with a
            FallbackWarning), "kernel" or "reference", as for ``assign``.
        check: raise ValueError with SciPy's words when a problem holds NaN or -inf or has no complete matching that
            avoids +inf (on CUDA this reads the op's status: one synchronisation). False: never synchronise; the
            rows of such a problem are all -1 (``torch.ops.lucid.linear_sum_assignment`` also returns the status).

    Returns:
        For a matrix: ``(row_ind, col_ind)``, int64 tensors of min(R, C) pairs, as SciPy returns them (rows
        ascending). For a batch: (B, R) int64, the column matched to each row of each problem, -1 for none.
    """
    _require_tensors(("cost",), (cost,))
    if cost.dtype not in FLOAT_DTYPES and not cost.is_complex():
        # SciPy's reading of integer and bool costs (int64 rounds as NumPy rounds it); float8 widens exactly
        try:
            cost = cost.to(torch.float64)
        except RuntimeError:  # a dtype torch cannot widen (packed float4)
            raise TypeError(f"cost must be real numbers (float32 or float64; other real dtypes are widened to "
                            f"float64), got {cost.dtype}") from None
    if maximize:
        cost = -cost  # exact in every float dtype; a new tensor, the caller's is left as it is
    if sizes is not None and not isinstance(sizes, torch.Tensor):
        sizes = _sizes_tensor(sizes)  # on the CPU: checked at the call, no synchronisation
    choose = _traced_lsap_choice if torch.compiler.is_compiling() else _lsap_choice
    if choose(backend, cost.device.type) == "kernel":
        rows, cols, info = ops.linear_sum_assignment(cost, sizes)
    else:
        check_lsap_inputs(cost, sizes)
        rows, cols, info = lsap.linear_sum_assignment(cost, sizes)
    if check:
        raise_unsolved(info)
    if cost.dim() == 2:
        n = min(cost.shape)
        return rows[:n], cols[:n]
    return pairs_to_columns(rows, cols, cost.shape[1])


# As for assign: torch.compile traces the choice as its result (settled before the first call).
_traced_lsap_choice = torch.compiler.assume_constant_result(_lsap_choice)


def _sizes_tensor(sizes) -> torch.Tensor:
    """``sizes`` given as a sequence (a list, a tuple, a NumPy array), as an int64 tensor on the CPU; every element
    an integer (a bool, a float or anything else is refused, not truncated)."""
    try:
        values = list(sizes)
    except TypeError:
        raise TypeError(f"sizes must be B integers (a list or a tensor), got {type(sizes).__name__}") from None
    for b, n in enumerate(values):
        try:
            values[b] = _integer(f"sizes[{b}]", n)
        except TypeError:
            raise TypeError(f"sizes must hold integers (the valid columns of each problem), got sizes[{b}] = "
                            f"{n!r}") from None
        if not -(2**63) <= values[b] < 2**63:
            raise ValueError(f"sizes[{b}] must be in [0, C], got {values[b]}")
    return torch.tensor(values, dtype=torch.long)


def pairs_to_columns(rows: torch.Tensor, cols: torch.Tensor, n_rows: int) -> torch.Tensor:
    """(B, K) pairs in SciPy's form (-1 after the last) to the (B, R) column of each row (-1 for none), on the device,
    without synchronising."""
    out = rows.new_full((rows.shape[0], n_rows + 1), -1)
    return out.scatter_(1, torch.where(rows >= 0, rows, n_rows), cols)[:, :n_rows]


def backends() -> dict:
    """What can run here: the reference always; the compiled ops per device when the library is loaded; and what
    ``backend="auto"`` picks for float32 inputs on each device."""
    probe = {}
    for device in ("cpu", "cuda"):
        why = device_unsupported(device)
        probe[device] = "kernel" if why is None else f"reference ({why})"
    return {
        "reference": True,
        "library": _library.loaded(),
        "library_error": _library.LOAD_ERROR,
        "cpu_ops": sorted(op for op in _OPS if _library.has_kernel(op, "cpu")),
        "cuda_ops": sorted(op for op in _OPS if _library.has_kernel(op, "cuda")),
        "cuda_device": torch.cuda.is_available(),
        "auto": probe,
        "forced": os.environ.get(ENV_BACKEND),
    }


_OPS = ("points_in_boxes", "pair_overlaps", "box_metrics", "resolve_conflicts", "assign", "assign_pose", "assign_seg",
        "linear_sum_assignment", "detr_cost")
