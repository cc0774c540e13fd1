"""The pose assignment (docs/spec.md, "Pose"): the reference against the peer's PoseTaskAlignedAssigner (ultralytics
8.4.190) and the kernels against the reference, on every device; on CUDA the kernel against the peer directly.

On the CPU the peer runs with ties to the lower index (test_reference_vs_peer.py). The CPU kernel's scores are
compared to the reference within a bound derived below: its OKS sums the keypoint terms in the order of PyTorch's CUDA
reduction, while the reference on the CPU sums them in ATen's CPU order.
"""

import math
import warnings

import pytest
import torch

import lucid_assign
from lucid_assign import api, checks, ops, reference
from lucid_assign.synthetic import anchor_points, pose_batch

from cases import pose_problem as problem, MODEL_SETTING_IDS, MODEL_SETTINGS, STRIDE_VAL, STRIDES
from conftest import devices
from contract import assert_matches, assert_same, lower_index_topk, pose_score_rtol

BOX = reference.INPUTS
POSE = reference.POSE_INPUTS


def run_peer(tal, device, inputs, **kw):
    peer = tal.PoseTaskAlignedAssigner(inputs[9], stride=list(STRIDES), **kw)
    with lower_index_topk(device):
        return peer(*inputs[:7], pd_kpts=inputs[7], gt_kpts=inputs[8])


def assert_kernel_matches(got, want, device, n_kpts, case=""):
    """The contract for a pose kernel (contract.py): bit for bit on CUDA, on the CPU within pose_score_rtol."""
    assert_matches(got, want, device == "cuda", case, rtol=pose_score_rtol(n_kpts))


def run_kernel(inputs, **kw):
    return ops.assign_pose(*inputs, stride_val=STRIDE_VAL, **kw)


def run_reference(inputs, **kw):
    return reference.assign_pose(*inputs, stride=STRIDES, **kw)


SETTINGS, SETTING_IDS = MODEL_SETTINGS, MODEL_SETTING_IDS


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("setting", SETTINGS, ids=SETTING_IDS)
@pytest.mark.parametrize("trainer_dtypes", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("seed", range(3))
def test_reference_matches_peer(peer_tal, device, setting, trainer_dtypes, seed):
    inputs = problem(seed, trainer_dtypes=trainer_dtypes, device=device)
    kw = dict(num_classes=3, beta=6.0, **setting)
    ours = run_reference(inputs, **kw)
    assert_same(ours, run_peer(peer_tal, device, inputs, **kw), f"seed={seed}")
    assert ours[3].any()


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("setting", SETTINGS, ids=SETTING_IDS)
@pytest.mark.parametrize("trainer_dtypes", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("seed", range(3))
def test_kernel_matches_reference(library, device, setting, trainer_dtypes, seed):
    inputs = problem(seed, trainer_dtypes=trainer_dtypes, device=device)
    kw = dict(num_classes=3, beta=6.0, **setting)
    assert_kernel_matches(run_kernel(inputs, **kw), run_reference(inputs, **kw), device, 17, f"seed={seed}")


@pytest.mark.cuda
@pytest.mark.parametrize("setting", SETTINGS[:2], ids=SETTING_IDS[:2])
@pytest.mark.parametrize("objects", [(20, 20), (100, 100)], ids=["m20", "m100"])
def test_kernel_matches_peer_on_cuda(peer_tal, library, setting, objects):
    """The training case: batch 16 at 640 px, the trainer's dtypes, the peer unpatched on CUDA."""
    inputs = problem(4, batch=16, img_size=640, objects=objects, num_classes=1, trainer_dtypes=True, device="cuda")
    kw = dict(num_classes=1, beta=6.0, **setting)
    assert_same(lucid_assign.PoseTaskAlignedAssigner(inputs[9], stride=list(STRIDES), backend="kernel", **kw)(
        *inputs[:7], pd_kpts=inputs[7], gt_kpts=inputs[8]), run_peer(peer_tal, "cuda", inputs, **kw))


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("keypoints", [0, 1, 2, 3, 5, 16, 21, 32, 33, 63])
def test_keypoint_counts(peer_tal, library, device, keypoints):
    """Every width of the keypoint sum's tree (1 to 32 lanes, with and without a second value per lane); no keypoints
    at all (the box overlap everywhere, with the level gate)."""
    inputs = problem(keypoints, keypoints=keypoints, device=device)
    kw = dict(num_classes=3, topk=10, alpha=0.5, beta=6.0)
    want = run_reference(inputs, **kw)
    assert_same(want, run_peer(peer_tal, device, inputs, **kw))
    assert_kernel_matches(run_kernel(inputs, **kw), want, device, keypoints)


def gate_edge_problem(device):
    """Square objects whose side is exactly lo*t or hi*t of a level, or the next float below or above it."""
    inputs = problem(7, objects=(24, 24), device=device)
    gt = inputs[4].clone()
    sides = []
    for t in STRIDES:
        for bound in (2.0 * t, 12.0 * t):
            for side in (bound, math.nextafter(bound, 0.0), math.nextafter(bound, math.inf)):
                sides.append(side)
    g = torch.Generator().manual_seed(7)
    for b in range(gt.shape[0]):
        for m, side in enumerate(sides[: gt.shape[1]]):
            side = min(side, 150.0)  # the image is 160 px: the largest sides are clipped, still on a level's edge
            c = 5 + torch.rand(2, generator=g, dtype=torch.float64) * 150
            x1, y1 = float(c[0]) - side / 2, float(c[1]) - side / 2
            # the box's side is exactly `side` in float32: x2 - x1 and y2 - y1 are exact
            x1, y1 = float(torch.tensor(x1, dtype=torch.float32)), float(torch.tensor(y1, dtype=torch.float32))
            gt[b, m] = torch.tensor([x1, y1, x1 + side, y1 + side])
    inputs[4] = gt
    return inputs


@pytest.mark.parametrize("device", devices())
def test_gate_edges(peer_tal, library, device):
    inputs = gate_edge_problem(device)
    gt = inputs[4].cpu()
    side = ((gt[..., 2] - gt[..., 0]) * (gt[..., 3] - gt[..., 1])).clamp(min=0).sqrt()
    on_edge = sum(int((side == b).sum()) for t in STRIDES for b in (2 * t, 12 * t))
    assert on_edge >= 8, "the case must put objects exactly on the gate's edges"
    kw = dict(num_classes=3, topk=10, alpha=0.5, beta=6.0)
    want = run_reference(inputs, **kw)
    assert_same(want, run_peer(peer_tal, device, inputs, **kw))
    assert_kernel_matches(run_kernel(inputs, **kw), want, device, 17)


def starved_problem(device):
    """Thin tall objects between the anchor columns of the coarse levels: too large for the finest level, no anchor
    inside on the others, so the gate leaves them without candidates and they keep their ungated ones."""
    inputs = problem(9, objects=(12, 12), device=device)
    gt = inputs[4].clone()
    for b in range(gt.shape[0]):
        for m in range(6):
            x1 = 32.0 * (m % 4) + 26.0  # anchors of stride 16 at 8 + 16k, of 32 at 16 + 32k: none in (26, 36)
            gt[b, m] = torch.tensor([x1, 5.0 + m, x1 + 10.0, 150.0 - m])
    inputs[4] = gt
    return inputs


@pytest.mark.parametrize("device", devices())
def test_rows_the_gate_would_starve(peer_tal, library, device):
    inputs = starved_problem(device)
    inside = reference.points_in_boxes(inputs[2].float(), inputs[4], inputs[5], STRIDE_VAL)
    gated = reference.level_gate(inside, inputs[4], inputs[6])
    strict = inside & ~(gated == inside).all(-1, keepdim=True)  # rows whose gate removed anchors
    starved = ((gated == inside).all(-1) & inside.any(-1) & (inputs[5][..., 0] > 0)).cpu()
    assert starved.sum() >= 6 and strict.any(), "the case must have rows the gate leaves empty, and gated rows"
    kw = dict(num_classes=3, topk=10, alpha=0.5, beta=6.0)
    want = run_reference(inputs, **kw)
    assert_same(want, run_peer(peer_tal, device, inputs, **kw))
    assert_kernel_matches(run_kernel(inputs, **kw), want, device, 17)


def odd(case, device):
    """Odd inputs, each defined in docs/odd-inputs.md: the results are the reference's (equal to the peer's)."""
    inputs = problem(11, objects=(10, 10), device=device)
    pd_kpts, gt_kpts, gt = inputs[7].clone(), inputs[8].clone(), inputs[4].clone()
    if case == "nan_visible_keypoint":
        gt_kpts[0, 1, 3, :2] = float("nan")
        gt_kpts[0, 1, 3, 2] = 2.0
    elif case == "nan_invisible_keypoint":  # exp(NaN) * 0 is NaN: the object's OKS is NaN
        gt_kpts[0, 2, 4] = torch.tensor([float("nan"), 1.0, 0.0])
        gt_kpts[0, 2, 5, 2] = 2.0
    elif case == "nan_predicted_keypoint":
        pd_kpts[1, :50, 0, 0] = float("nan")
    elif case == "nan_visibility":  # NaN > 0 is false: not visible
        gt_kpts[1, 0, :, 2] = float("nan")
    elif case == "no_visible_keypoints":
        gt_kpts[:, ::2, :, 2] = 0.0
    elif case == "zero_area_box":  # side 0 and OKS scale eps: exp(-d^2 / tiny) is 0 but where d is 0
        gt[0, 0, 2] = gt[0, 0, 0]
        gt[1, 1, 3] = gt[1, 1, 1]
        gt_kpts[0, 0, :, :2] = pd_kpts[0, 0, :, :2].float()
    elif case == "negative_area_box":  # x2 < x1: side NaN-free 0 (clamped), a negative OKS scale
        gt[0, 3, [0, 2]] = gt[0, 3, [2, 0]]
    elif case == "infinite_keypoint":
        gt_kpts[1, 2, 0, 0] = float("inf")
        gt_kpts[1, 2, 0, 2] = 2.0
    elif case == "nan_stride":  # the strides' min and max are NaN: no level is open-ended
        inputs[6] = inputs[6].clone()
        inputs[6][5] = float("nan")
    elif case == "single_level":  # the one level is the smallest and the largest: no anchor is gated out
        inputs[6] = torch.full_like(inputs[6], 8.0)
    else:
        raise AssertionError(case)
    inputs[4], inputs[7], inputs[8] = gt, pd_kpts, gt_kpts
    return inputs


ODD = ["nan_visible_keypoint", "nan_invisible_keypoint", "nan_predicted_keypoint", "nan_visibility",
       "no_visible_keypoints", "zero_area_box", "negative_area_box", "infinite_keypoint", "nan_stride", "single_level"]


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("case", ODD)
def test_odd_inputs(peer_tal, library, device, case):
    inputs = odd(case, device)
    kw = dict(num_classes=3, topk=10, alpha=0.5, beta=6.0)
    want = run_reference(inputs, **kw)
    theirs = run_peer(peer_tal, device, inputs, **kw)
    for name, a, b in zip(("labels", "boxes", "scores", "fg", "idx"), want, theirs):
        assert a.dtype == b.dtype and torch.equal(a.isnan(), b.isnan()), name
        assert torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0)), f"{case} {name} differs from the peer"
    assert_kernel_matches(run_kernel(inputs, **kw), want, device, 17, case)


@pytest.mark.parametrize("device", devices())
def test_many_objects(library, device):
    """300 people per image at 640 px: long candidate lists, many conflicts, rows taken by blocks on CUDA."""
    inputs = problem(12, batch=2, img_size=640, objects=(250, 300), num_classes=1, device=device)
    kw = dict(num_classes=1, topk=10, alpha=0.5, beta=6.0)
    assert_kernel_matches(run_kernel(inputs, **kw), run_reference(inputs, **kw), device, 17)


@pytest.mark.parametrize("device", devices())
def test_no_objects_and_padding(peer_tal, library, device):
    inputs = problem(13, device=device)
    empty = list(inputs)
    empty[3], empty[4], empty[5], empty[8] = (t[:, :0] for t in (inputs[3], inputs[4], inputs[5], inputs[8]))
    kw = dict(num_classes=3, topk=10)
    got = run_kernel(empty, **kw)
    assert (got[0] == 3).all() and not got[3].any() and not got[2].any()
    padded = list(inputs)
    padded[5] = torch.zeros_like(inputs[5])
    assert_kernel_matches(run_kernel(padded, **kw), run_reference(padded, **kw), device, 17)


@pytest.mark.parametrize("device", devices())
def test_inputs_not_modified(library, device):
    inputs = problem(14, trainer_dtypes=True, device=device)
    before = [t.clone() for t in inputs]
    run_kernel(inputs, num_classes=3, topk=7, topk2=3)
    api.assign_pose(*inputs, num_classes=3, topk=7, topk2=3, backend="reference")
    for a, b in zip(inputs, before):
        assert torch.equal(a.nan_to_num(0), b.nan_to_num(0))


def test_more_keypoints_than_the_kernels_take(library):
    """64 keypoints: the kernels refuse with a clear error; backend "auto" runs the reference and says so once."""
    inputs = problem(15, keypoints=64)
    with pytest.raises(ValueError, match="at most 63"):
        run_kernel(inputs, num_classes=3, topk=10)
    with pytest.raises(RuntimeError, match="at most 63"):
        api.assign_pose(*inputs, num_classes=3, topk=10, backend="kernel")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = api.assign_pose(*inputs, num_classes=3, topk=10)
    assert any("at most 63" in str(w.message) for w in seen)
    for a, b in zip(got, run_reference(inputs, num_classes=3, topk=10)):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda x: x.__setitem__(7, x[7][..., :1]), "pd_kpts must (have shape|be)"),
        (lambda x: x.__setitem__(8, x[8][..., :2]), "gt_kpts must be"),
        (lambda x: x.__setitem__(9, x[9][:5]), "sigmas must (have shape|be)"),
        (lambda x: x.__setitem__(6, x[6][:-1]), "anc_strides must (have shape|be)"),
        (lambda x: x.__setitem__(6, x[6].long()), "anc_strides must (be a float16|have the dtype)"),
        (lambda x: x.__setitem__(7, x[7].to(torch.float8_e4m3fn)), "pd_kpts must be a float16, bfloat16"),
        (lambda x: x.__setitem__(9, x[9].tolist()), "sigmas must be a torch.Tensor"),
    ],
    ids=["pd_kpts", "gt_kpts", "sigmas", "anc_strides", "strides_dtype", "kpts_float8", "sigmas_type"],
)
@pytest.mark.parametrize("backend", ["auto", "reference"])
def test_bad_inputs_name_the_argument(change, match, backend):
    """Checked by the op on the kernel path (auto, with the library) and by the Python layer on the reference's."""
    inputs = problem(16)
    change(inputs)
    with pytest.raises((ValueError, TypeError), match=match):
        api.assign_pose(*inputs, num_classes=3, topk=10, backend=backend)


def test_the_kernel_path_is_checked_by_the_op(library, monkeypatch):
    """As for assign (test_dispatch.py): a call the kernel takes runs no Python check of its tensors, whatever its
    object count, and gives the reference's outputs; gt_kpts whose object count is not gt_bboxes' are refused by the
    op, naming the argument."""
    checked = []
    real = checks.check_pose_inputs
    monkeypatch.setattr(checks, "check_pose_inputs", lambda *a: checked.append(1) or real(*a))
    kw = dict(num_classes=3, topk=10)
    inputs = problem(40)
    assert inputs[4].shape[1] > 3
    fewer = [t[:, :3] if i in (3, 4, 5, 8) else t for i, t in enumerate(inputs)]
    for x in (inputs, fewer):
        assert_kernel_matches(api.assign_pose(*x, **kw), run_reference(x, **kw), "cpu", inputs[8].shape[2])
    assert checked == []
    bad = list(inputs)
    bad[8] = inputs[8][:, :-1]
    with pytest.raises(ValueError, match="gt_kpts must be"):
        api.assign_pose(*bad, **kw)
    assert checked == []


def test_the_module_passes_its_rule_set(library):
    """The drop-in pose module assigns under its own rule set (8.4.180: no level gate, the mean of CIoU and OKS), on
    both backends."""
    inputs = problem(41)
    kw = dict(num_classes=3, topk=10)
    outs = {}
    for rules in ("8.4.144", "8.4.180"):
        for backend in ("kernel", "reference"):
            module = lucid_assign.PoseTaskAlignedAssigner(inputs[9], backend=backend, rules=rules, **kw)
            outs[rules, backend] = module(*inputs[:9])
        want = api.assign_pose(*inputs, rules=rules, backend="reference", **kw)
        for backend in ("kernel", "reference"):
            assert_kernel_matches(outs[rules, backend], want, "cpu", inputs[8].shape[2])
    assert not torch.equal(outs["8.4.144", "reference"][2], outs["8.4.180", "reference"][2])


def test_oriented_boxes_are_refused(library):
    inputs = problem(17)
    inputs[1] = torch.cat((inputs[1], torch.zeros_like(inputs[1][..., :1])), -1)
    inputs[4] = torch.cat((inputs[4], torch.zeros_like(inputs[4][..., :1])), -1)
    for backend in ("auto", "reference"):
        with pytest.raises(ValueError, match="x1y1x2y2"):
            api.assign_pose(*inputs, num_classes=3, topk=10, backend=backend)
    with pytest.raises(ValueError, match="x1y1x2y2"):
        run_kernel(inputs, num_classes=3, topk=10)


@pytest.mark.cuda
def test_memory_bounded(library):
    """No (B, M, A) tensor: 16 images of 400 people at 640 px would need 16 * 400 * 8400 = 54M elements per dense
    tensor; the call's peak beyond its inputs stays near its outputs."""
    inputs = problem(18, batch=16, img_size=640, objects=(400, 400), num_classes=1, trainer_dtypes=True,
                     device="cuda")
    kw = dict(num_classes=1, topk=10)
    run_kernel(inputs, **kw)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = run_kernel(inputs, **kw)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    outputs = sum(t.numel() * t.element_size() for t in out)
    dense = 16 * 400 * 8400  # one bool per (image, row, anchor)
    assert peak - outputs < dense / 4, f"peak {peak} bytes beyond the inputs, outputs {outputs}"


def test_module_constructor_and_defaults():
    sigmas = torch.full((5,), 0.2)
    m = lucid_assign.PoseTaskAlignedAssigner(sigmas, topk=7, num_classes=4, alpha=0.5, beta=6.0, stride=[8, 16, 32],
                                             topk2=1, backend="reference")
    assert m.sigmas is sigmas and m.topk == 7 and m.topk2 == 1 and m.level_range == reference.LEVEL_RANGE
    inputs = problem(19, keypoints=5, num_classes=4)
    with pytest.raises(TypeError, match="pd_kpts"):
        m(*inputs[:7])
    out = m(*inputs[:7], pd_kpts=inputs[7], gt_kpts=inputs[8])
    want = reference.assign_pose(*inputs[:9], sigmas, num_classes=4, topk=7, topk2=1, alpha=0.5, stride=STRIDES)
    for a, b in zip(out, want):
        assert torch.equal(a, b)


def test_pose_batch_anchor_strides():
    b = pose_batch(batch=1, img_size=64, objects=2)
    anc = anchor_points(64)
    assert torch.equal(b["anc_points"], anc) and b["anc_strides"].shape == (anc.shape[0],)
    assert b["anc_strides"].unique().tolist() == [8.0, 16.0, 32.0]


@pytest.mark.cuda
def test_cuda_graph_capture(library):
    """assign_pose captured in a CUDA graph (no host synchronisation) and replayed with new inputs copied into the
    captured buffers equals eager and the reference."""
    problems = [problem(seed, objects=(12, 12), trainer_dtypes=True, device="cuda") for seed in (21, 22, 23)]
    kw = dict(num_classes=3, topk=10, topk2=4, alpha=0.5)
    static = [t.clone() for t in problems[0]]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # warm-up outside the graph
            run_kernel(static, **kw)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run_kernel(static, **kw)
    for inputs in problems[1:] + problems[:1]:
        for dst, src in zip(static, inputs):
            dst.copy_(src)
        graph.replay()
        eager = run_kernel(inputs, **kw)
        want = run_reference(inputs, **kw)
        for a, b, c in zip(captured, eager, want):
            assert torch.equal(a, b) and torch.equal(a, c)


@pytest.mark.parametrize("device", devices())
def test_compile_fullgraph(library, device):
    """A torch.compile(fullgraph=True) loss over api.assign_pose equals eager, over three batches."""
    kw = dict(num_classes=3, topk=10, topk2=4, alpha=0.5)

    def loss(*args):
        labels, boxes, scores, fg, idx = api.assign_pose(*args, **kw)
        return scores.sum(-1), fg, idx

    torch._dynamo.reset()
    compiled = torch.compile(loss, fullgraph=True)
    for seed in (21, 22, 23):
        inputs = problem(seed, objects=(12, 12), trainer_dtypes=True, device=device)
        assert all(torch.equal(a, b) for a, b in zip(compiled(*inputs), loss(*inputs)))
