"""The one dispatch: which backend runs a call, for every op (the assignments and the linear sum assignment alike).

Backends: ``"kernel"`` (the compiled ops, torch.ops.lucid.*), ``"reference"`` (the pure-PyTorch code of
lucid_assign.reference and lucid_assign.lsap) and ``"auto"`` (the kernel where the library is loaded, has a kernel for
the tensors' device and takes their dtypes and sizes; otherwise the reference, or the trainer's own code in a patched
trainer, saying once why). The environment variable ``LUCID_ASSIGN_BACKEND`` (auto | kernel | reference), when set,
overrides the argument everywhere.

What the kernels take is one table, keyed by a call's support key (the op, the device type and the dtypes and sizes
its kernels limit), asked once per key (``reason``); ``choose`` turns a backend and a key into the choice, the same
for the functional API, the modules and every trainer integration, eager or traced by torch.compile.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Callable, NamedTuple, Sequence

import torch

from . import _library, checks, ops, reference
from .reference import INPUTS, POSE_INPUTS, SEG_INPUTS

BACKENDS = ("auto", "kernel", "reference")
ENV_BACKEND = "LUCID_ASSIGN_BACKEND"
OPS = ("points_in_boxes", "pair_overlaps", "box_metrics", "resolve_conflicts", "assign", "assign_pose", "assign_seg",
       "linear_sum_assignment", "detr_cost")
_warned: set = set()


class FallbackWarning(UserWarning):
    """A call goes to a slower path than the one asked for: ``backend="auto"`` runs the reference (the functional API
    and the drop-in modules) or the trainer's own code (a patched trainer) because the kernel cannot take its
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


def kernel_fix(device: str, why: str) -> str:
    """What to do so that the kernel runs, for a reason given by reason() or unsupported()."""
    return getattr(why, "fix", None) or "see docs/odd-inputs.md for what each backend takes"


# ---- what the kernels take: one table, keyed by the support key -------------------------------------------------


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


def _widens_exactly(narrow: torch.dtype, wide: torch.dtype) -> bool:
    return narrow == wide or (narrow in checks.FLOAT_DTYPES and wide in checks.FLOAT_DTYPES
                               and torch.promote_types(narrow, wide) == wide)


def _box_unsupported(device, score_dtype, pd_dtype, anchor_dtype, box_dtype, op="assign") -> Reason | None:
    why = device_unsupported(device, op)
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


def _pose_unsupported(device, score_dtype, pd_dtype, anchor_dtype, box_dtype, strides_dtype, pd_kpts_dtype,
                      gt_kpts_dtype, sigmas_dtype, n_kpts) -> Reason | None:
    why = _box_unsupported(device, score_dtype, pd_dtype, anchor_dtype, box_dtype, "assign_pose")
    if why:
        return why
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


def _seg_unsupported(device, score_dtype, pd_dtype, anchor_dtype, box_dtype, scale_dtype, pixels) -> Reason | None:
    why = _box_unsupported(device, score_dtype, pd_dtype, anchor_dtype, box_dtype, "assign_seg")
    if why:
        return why
    if scale_dtype not in (torch.float32, torch.float64):
        return Reason(f"the kernel takes a float32 or float64 mask_scale, got {scale_dtype}",
                      "pass mask_scale as float32 (mask_scale.float())")
    most = _library.limit("MAX_MASK_PIXELS")
    if pixels > most:
        return Reason(f"the kernels take masks of at most {most} pixels (exact float32 counts), got {pixels}",
                      "none is needed for the results, which are the same; for speed, use smaller masks")
    return None


# op -> (its support key's facts after the device) -> Reason | None; every key is (op, device type, *facts)
_RULES: dict[str, Callable] = {
    "assign": _box_unsupported,
    "assign_pose": _pose_unsupported,
    "assign_seg": _seg_unsupported,
    "linear_sum_assignment": lambda device: device_unsupported(device, "linear_sum_assignment"),
    "detr_cost": lambda device: device_unsupported(device, "detr_cost"),
}
_unsupported: dict = {}  # support key -> Reason | None


def reason(key: tuple) -> Reason | None:
    """Why the op cannot take calls of this support key ``(op, device type, *facts)``, or None; asked once per key."""
    if key not in _unsupported:
        _unsupported[key] = _RULES[key[0]](*key[1:])
    return _unsupported[key]


def _fallback(backend: str, why: Reason, device: str) -> str:
    if backend == "kernel":
        raise RuntimeError(f"backend='kernel' cannot run: {why}")
    if why not in _warned:  # say it once per reason: users hate silent slow paths
        _warned.add(why)
        warn_caller(f"lucid_assign: falling back to the pure-PyTorch reference: {why}. Fix: {kernel_fix(device, why)}")
    return "reference"


def choose(backend: str, key: tuple, on_unsupported: Callable | None = None) -> str:
    """"kernel" or "reference" for a call of support key ``key`` under ``backend``: the kernel where it takes the
    call; where it does not, an error for "kernel" and for "auto" the reference, said once per reason (a
    FallbackWarning), or what ``on_unsupported(why)`` returns (a patched trainer runs its own code then)."""
    backend = resolve_backend(backend)
    if backend == "reference":
        return backend
    why = reason(key)
    if why is None:
        return "kernel"
    if on_unsupported is not None and backend == "auto":
        return on_unsupported(why)
    return _fallback(backend, why, key[1])


def traced_choose(backend: str, key: tuple) -> str:
    """choose(), which torch.compile traces as its result: it reads the environment, the library's registrations and
    a cache, which the graph does not need to see (they are settled before the first call)."""
    return choose(backend, key)


# What torch.compiler.assume_constant_result(traced_choose) does (torch 2.4 to 2.15; tests/test_dispatch.py checks that
# it still does), without importing torch._dynamo, which it imports (0.8 s on a 2-core machine) and which a process
# that never compiles does not need.
traced_choose._dynamo_marked_constant = True


def choice(backend: str, key: tuple, on_unsupported: Callable | None = None) -> str:
    """choose(), traced as a constant while torch.compile traces the caller (where on_unsupported is not taken)."""
    if torch.compiler.is_compiling():
        return traced_choose(backend, key)
    return choose(backend, key, on_unsupported)


# ---- the assignments: one run for assign, assign_pose and assign_seg ---------------------------------------------


class Task(NamedTuple):
    """What the three assignment entry points differ in; their dispatch (run) is one."""

    name: str  # of the op (torch.ops.lucid.<name>, ops.<name>) and of the reference's function (reference.<name>)
    extra_names: tuple  # the inputs after the six box inputs
    check_extra: Callable | None  # (pd_scores, gt_bboxes, *extra, **task settings) -> None
    support_facts: Callable | None  # (*extra) -> what the kernel's support of the extra inputs depends on


def _pose_facts(anc_strides, pd_kpts, gt_kpts, sigmas) -> tuple:
    n_kpts = gt_kpts.shape[2] if gt_kpts.dim() == 4 else 0  # a bad shape is the op's to report
    return anc_strides.dtype, pd_kpts.dtype, gt_kpts.dtype, sigmas.dtype, n_kpts


def _seg_facts(pd_coef, mask_scale, proto, gt_masks) -> tuple:
    pixels = proto.shape[-2] * proto.shape[-1] if proto.dim() == 4 else 0
    return mask_scale.dtype, pixels


TASKS = {t.name: t for t in (
    Task("assign", (), None, None),
    Task("assign_pose", POSE_INPUTS,
         lambda s, g, *extra, level_range: checks.check_pose_inputs(s, g, *extra, level_range), _pose_facts),
    Task("assign_seg", SEG_INPUTS, lambda s, g, *extra: checks.check_seg_inputs(s, g, *extra), _seg_facts),
)}


def support_key(task: Task, box, extra=()) -> tuple:
    """What the kernel's support of an assignment depends on: the op, the device type, the dtypes and the sizes the
    kernels limit (their shapes otherwise are the op's to check)."""
    pd_scores, pd_bboxes, anc_points, _, gt_bboxes, _ = box
    key = (task.name, pd_scores.device.type, pd_scores.dtype, pd_bboxes.dtype, anc_points.dtype, gt_bboxes.dtype)
    return key if task.support_facts is None else key + task.support_facts(*extra)


def unsupported(task: str, box: Sequence[torch.Tensor], extra: Sequence[torch.Tensor] = ()) -> Reason | None:
    """Why the compiled op ``task`` ("assign", "assign_pose" or "assign_seg") cannot take these tensors (``box``: the
    six box inputs, ``extra``: the pose or mask inputs), or None when it can."""
    return reason(support_key(TASKS[task], box, extra))


def kernel_unsupported(pd_scores, pd_bboxes, anc_points, gt_bboxes) -> Reason | None:
    """Why the compiled assign cannot take these box inputs, or None when it can."""
    return unsupported("assign", (pd_scores, pd_bboxes, anc_points, None, gt_bboxes, None))


def _check_all(task: Task, box, extra, settings: dict, task_settings: dict, read_values: bool) -> None:
    checks.check_inputs(*box, topk=settings["topk"], topk2=settings["topk2"], num_classes=settings["num_classes"],
                        stride=settings["stride"], read_values=read_values)
    if task.check_extra is not None:
        task.check_extra(box[0], box[4], *extra, **task_settings)


def run(task: Task, box, extra, settings: dict, task_settings: dict, backend: str,
        on_unsupported: Callable | None = None):
    """An assignment: the settings checked, the backend chosen, the call run. Every tensor is checked here unless the
    kernel takes the call (the op checks them then). With ``on_unsupported``, a call the kernel cannot take under
    "auto" returns None (the caller runs it elsewhere)."""
    checks.check_settings(**{k: settings[k] for k in ("topk", "topk2", "num_classes", "alpha", "beta", "stride", "eps",
                                                      "rules")}, **task_settings)
    if torch.compiler.is_compiling():
        _check_all(task, box, extra, settings, task_settings, read_values=False)
        chosen = traced_choose(backend, support_key(task, box, extra))
    elif resolve_backend(backend) == "reference":
        _check_all(task, box, extra, settings, task_settings, read_values=True)
        chosen = "reference"
    else:
        checks.require_tensors(INPUTS + task.extra_names, (*box, *extra))
        key = support_key(task, box, extra)
        if reason(key) is not None:
            _check_all(task, box, extra, settings, task_settings, read_values=True)
        chosen = choose(backend, key, on_unsupported)
    stride = list(settings["stride"])
    kw = dict(topk=settings["topk"], topk2=settings["topk2"], num_classes=settings["num_classes"],
              alpha=settings["alpha"], beta=settings["beta"], eps=settings["eps"], rules=settings["rules"])
    if chosen == "kernel":
        # anchors of a narrower float type (bf16 under autocast, as the peer trainer makes them) are widened by the
        # kernel: exact, and what the reference's type promotion does in every operation
        return getattr(ops, task.name)(*box, *extra, stride_val=reference.stride_value(stride),
                                       first_stride=stride[0], **kw, **task_settings)
    if chosen == "reference":
        return getattr(reference, task.name)(*box, *extra, stride=stride, **kw, **task_settings)
    return None


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
        "cpu_ops": sorted(op for op in OPS if _library.has_kernel(op, "cpu")),
        "cuda_ops": sorted(op for op in OPS if _library.has_kernel(op, "cuda")),
        "cuda_device": torch.cuda.is_available(),
        "auto": probe,
        "forced": os.environ.get(ENV_BACKEND),
    }
