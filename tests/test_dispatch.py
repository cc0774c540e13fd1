"""Backend choice of the Python API: backend="auto" | "kernel" | "reference", LUCID_ASSIGN_BACKEND, and the fallback
that says why it happened."""

import warnings

import pytest
import torch

import lucid_assign
from lucid_assign import checks, dispatch, ops, reference

from cases import STRIDES, make_problem
from contract import assert_matches


@pytest.fixture
def spies(monkeypatch):
    calls = []
    real_ops, real_ref = ops.assign, reference.assign
    monkeypatch.setattr(ops, "assign", lambda *a, **k: calls.append("kernel") or real_ops(*a, **k))
    monkeypatch.setattr(reference, "assign", lambda *a, **k: calls.append("reference") or real_ref(*a, **k))
    monkeypatch.delenv(dispatch.ENV_BACKEND, raising=False)
    dispatch._warned.clear()
    return calls


KW = dict(num_classes=7, topk=10, stride=STRIDES)


def test_auto_uses_the_kernel_on_cpu(library, spies):
    out = lucid_assign.assign(*make_problem(0, True), **KW)
    assert spies == ["kernel"]
    ref = reference.assign(*make_problem(0, True), **KW)
    assert torch.equal(out[3], ref[3]) and torch.equal(out[4], ref[4])


def test_reference_backend(spies):
    lucid_assign.assign(*make_problem(0, False), backend="reference", **KW)
    assert spies == ["reference"]


def test_auto_falls_back_once_with_the_reason(library, spies):
    args = list(make_problem(0, True))
    args[2] = args[2].double()  # anchors of another dtype than the boxes: not supported by the kernel
    with pytest.warns(UserWarning, match="anc_points"):
        lucid_assign.assign(*args, **KW)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same reason is not repeated
        lucid_assign.assign(*args, **KW)
    assert spies == ["reference", "reference"]


def test_kernel_backend_refuses_unsupported_inputs(library, spies):
    args = list(make_problem(0, True))
    args[1] = args[1].double()
    args[4] = args[4].double()
    with pytest.raises(RuntimeError, match="backend='kernel' cannot run"):
        lucid_assign.assign(*args, backend="kernel", **KW)


def test_environment_variable_forces_a_backend(library, spies, monkeypatch):
    monkeypatch.setenv(dispatch.ENV_BACKEND, "reference")
    lucid_assign.assign(*make_problem(0, True), backend="kernel", **KW)
    monkeypatch.setenv(dispatch.ENV_BACKEND, "kernel")
    lucid_assign.assign(*make_problem(0, True), backend="reference", **KW)
    assert spies == ["reference", "kernel"]
    monkeypatch.setenv(dispatch.ENV_BACKEND, "fast")
    with pytest.raises(ValueError, match=dispatch.ENV_BACKEND):
        lucid_assign.assign(*make_problem(0, True), **KW)


def test_unknown_backend_is_an_error():
    with pytest.raises(ValueError, match="backend"):
        lucid_assign.assign(*make_problem(0, True), backend="gpu", **KW)
    with pytest.raises(ValueError, match="backend"):
        lucid_assign.RotatedTaskAlignedAssigner(backend="gpu")


@pytest.mark.parametrize("obb", [False, True])
def test_modules_dispatch(library, spies, obb):
    cls = lucid_assign.RotatedTaskAlignedAssigner if obb else lucid_assign.TaskAlignedAssigner
    inputs = make_problem(1, obb)
    out_k = cls(topk=10, num_classes=7, stride=list(STRIDES))(*inputs)
    out_r = cls(topk=10, num_classes=7, stride=list(STRIDES), backend="reference")(*inputs)
    assert spies == ["kernel", "reference"]
    assert_matches(out_k, out_r, exact=False)


def test_backends_report(library):
    info = lucid_assign.backends()
    assert info["library"] and info["reference"]
    assert {"assign", "points_in_boxes", "pair_overlaps", "box_metrics", "resolve_conflicts"} <= set(info["cpu_ops"])
    assert info["auto"]["cpu"] == "kernel"


def test_narrow_anchors_are_widened_for_the_kernel(library, spies):
    """bf16 anchors (the peer under autocast) with float32 boxes: exact to widen, so the kernel runs and agrees."""
    args = list(make_problem(2, True))
    args[2] = args[2].bfloat16()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = lucid_assign.assign(*args, **KW)
    assert spies == ["kernel"]
    want = reference.assign(*args, **KW)
    for i in (0, 1, 3, 4):
        assert torch.equal(got[i], want[i])


def test_the_kernel_path_is_checked_by_the_op(library, spies, monkeypatch):
    """A call the kernel takes is checked once, by the op (csrc/checks.h), not by the Python layer: labels out of
    range, a shape and a setting that do not fit are refused naming the argument, with the reference's exception
    classes. The reference path has no checks of its own, so the Python layer checks its calls."""
    checked = []
    real = checks.check_inputs
    monkeypatch.setattr(checks, "check_inputs", lambda *a, **k: checked.append(1) or real(*a, **k))
    args = list(make_problem(0, True))
    lucid_assign.assign(*args, **KW)
    bad = list(args)
    bad[3] = args[3].clone()
    bad[3][bad[5][..., 0] != 0] = 7  # every real object's label out of [0, 7)
    with pytest.raises(ValueError, match="gt_labels"):
        lucid_assign.assign(*bad, **KW)
    bad = list(args)
    bad[2] = args[2][:-1]
    with pytest.raises(ValueError, match="anc_points"):
        lucid_assign.assign(*bad, **KW)
    with pytest.raises(ValueError, match="num_classes"):
        lucid_assign.assign(*args, **dict(KW, num_classes=8))
    assert checked == [] and spies == ["kernel"] * 4
    with pytest.raises(ValueError, match="anc_points"):
        lucid_assign.assign(*bad, backend="reference", **KW)
    assert checked == [1] and spies == ["kernel"] * 4


@pytest.mark.parametrize("position", range(6))
def test_a_non_tensor_argument_is_named(position):
    """Not a tensor: refused with a TypeError naming the argument, before any backend runs."""
    args = list(make_problem(0, True))
    args[position] = args[position].tolist()
    names = reference.INPUTS
    with pytest.raises(TypeError, match=names[position]):
        lucid_assign.assign(*args, **KW)


def test_every_object_count_runs_the_kernel(library, spies):
    """A trainer's batches bring a new object count M step after step: each runs the kernel, with the reference's
    outputs."""
    for n_boxes in (12, 5, 30, 1):
        args = make_problem(n_boxes, True, n_boxes=n_boxes, pad_rows=min(3, n_boxes - 1))
        got = lucid_assign.assign(*args, **KW)
        want = reference.assign(*args, **KW)
        for i in (0, 1, 3, 4):
            assert torch.equal(got[i], want[i]), (n_boxes, i)
    assert spies == ["kernel", "reference"] * 4


def _fallback_warnings(fn):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        fn()
    return [w for w in seen if issubclass(w.category, lucid_assign.FallbackWarning)]


def test_the_fallback_warning_is_public_and_points_at_the_caller(library, spies, monkeypatch):
    """One public class (the patched peer's FallbackWarning too), whose location is the line that called the
    assigner, the functional form or the module, so that a user can find and filter it."""
    args = list(make_problem(0, True))
    args[2] = args[2].double()
    module = lucid_assign.RotatedTaskAlignedAssigner(topk=10, num_classes=7, stride=list(STRIDES))
    monkeypatch.setattr(dispatch, "_warned", set())  # what is said once here must still be said to later tests
    for call in (lambda: lucid_assign.assign(*args, **KW), lambda: module(*args)):
        dispatch._warned.clear()
        seen = _fallback_warnings(call)
        assert len(seen) == 1 and seen[0].filename == __file__, [(w.filename, w.lineno) for w in seen]
    dispatch._warned.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.simplefilter("ignore", lucid_assign.FallbackWarning)
        lucid_assign.assign(*args, **KW)  # filtered by its class
    from lucid_assign.integrations import ultralytics as integ

    assert integ.FallbackWarning is lucid_assign.FallbackWarning and issubclass(integ.FallbackWarning, UserWarning)


def _pose_inputs(keypoints=17):
    from lucid_assign.synthetic import pose_batch

    b = pose_batch(batch=1, img_size=128, num_classes=7, objects=(3, 5), keypoints=keypoints, seed=2)
    return [b[k] for k in ("pd_scores", "pd_bboxes", "anc_points", "gt_labels", "gt_bboxes", "mask_gt",
                           "anc_strides", "pd_kpts", "gt_kpts", "sigmas")]


def _seg_inputs():
    from lucid_assign.synthetic import seg_batch

    b = seg_batch(batch=1, img_size=128, num_classes=7, objects=(3, 5), mask_dim=4, seed=2)
    return [b[k] for k in ("pd_scores", "pd_bboxes", "anc_points", "gt_labels", "gt_bboxes", "mask_gt", "pd_coef",
                           "mask_scale", "proto", "gt_masks")]


def _with(inputs, i, fn):
    inputs = list(inputs)
    inputs[i] = fn(inputs[i])
    return inputs


FALLBACKS = {  # a call the kernel cannot take -> (the call, what its fix must say)
    "anchors": (lambda: lucid_assign.assign(*_with(make_problem(0, True), 2, torch.Tensor.double), **KW),
                "pass pd_bboxes and anc_points as torch.float32"),
    "scores": (lambda: lucid_assign.assign(*_with(make_problem(0, True), 0, torch.Tensor.double), **KW),
               "pass pd_scores as torch.float32"),
    "keypoints": (lambda: lucid_assign.assign_pose(*_pose_inputs(70), num_classes=7, topk=10),
                  "none is needed for the results"),
    "sigmas": (lambda: lucid_assign.assign_pose(*_with(_pose_inputs(), 9, torch.Tensor.double), num_classes=7,
                                                topk=10), "pass gt_kpts and sigmas as torch.float32"),
    "strides": (lambda: lucid_assign.assign_pose(*_with(_pose_inputs(), 6, torch.Tensor.double), num_classes=7,
                                                 topk=10), "pass anc_strides as torch.float32"),
    "mask_scale": (lambda: lucid_assign.assign_seg(*_with(_seg_inputs(), 7, torch.Tensor.half), num_classes=7,
                                                   topk=10), "pass mask_scale as float32"),
}


@pytest.mark.parametrize("case", FALLBACKS)
def test_each_fallback_reason_carries_its_own_fix(library, case, monkeypatch):
    call, fix = FALLBACKS[case]
    monkeypatch.setattr(dispatch, "_warned", set())
    seen = _fallback_warnings(call)
    assert len(seen) == 1
    message = str(seen[0].message)
    assert "Fix: " in message and fix in message.split("Fix: ", 1)[1], message
    others = [f for c, (_, f) in FALLBACKS.items() if c != case]
    assert not any(other in message for other in others), message
    assert "pass tensors of the dtypes the kernel takes" not in message


def test_the_traced_choice_is_marked_as_torch_compiler_marks_it():
    """dispatch marks traced_choose for torch.compile without importing torch._dynamo (which
    torch.compiler.assume_constant_result imports): the mark must be the one that function sets, in this torch."""
    marked = torch.compiler.assume_constant_result(lambda backend, key: backend)
    own = {k for k in vars(marked) if not k.startswith("__")}
    assert own == {k for k in vars(dispatch.traced_choose) if not k.startswith("__")} == {"_dynamo_marked_constant"}
    assert dispatch.traced_choose._dynamo_marked_constant is marked._dynamo_marked_constant is True
