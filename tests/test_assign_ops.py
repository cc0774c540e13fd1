"""torch.ops.lucid.assign and the pass ops against the reference (docs/spec.md), on every device the library supports.

On the CPU the promise is the reference's discrete outputs exactly and its scores to a relative 1e-6 (docs/spec.md); the
CUDA kernels, where present, must match bit for bit.
"""

import pytest
import torch

from lucid_assign import ops, reference

from cases import STRIDES, make_problem, pose_problem, seg_problem, to
from conftest import devices
from contract import CPU_SCORE_RTOL, assert_matches

def run_both(device, inputs, **kw):
    inputs = to(device, inputs)
    want = reference.assign(*inputs, stride=STRIDES, **kw)
    got = ops.assign(*inputs, stride_val=reference.stride_value(STRIDES), **kw)
    return got, want


SETTINGS = [dict(topk=10, topk2=None), dict(topk=13, topk2=None), dict(topk=7, topk2=1), dict(topk=10, topk2=4)]


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("obb", [False, True], ids=["hbb", "obb"])
@pytest.mark.parametrize("setting", SETTINGS, ids=["k10", "k13", "k7k2_1", "k10k2_4"])
@pytest.mark.parametrize("score_dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("seed", range(3))
def test_assign_matches_reference(library, device, obb, setting, score_dtype, seed):
    inputs = make_problem(seed, obb, score_dtype=score_dtype)
    # alpha 0.7 is not a float16/bfloat16 number: PyTorch rounds the exponent to the score dtype before pow
    got, want = run_both(device, inputs, num_classes=7, alpha=(1.0, 0.5, 0.7)[seed], **setting)
    assert_matches(got, want, device == "cuda", f"seed={seed}")
    assert want[3].any()


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("obb", [False, True], ids=["hbb", "obb"])
@pytest.mark.parametrize(
    "case",
    [
        dict(batch=3, n_boxes=60, pad_rows=10),  # crowded: many conflicts
        dict(tiny_frac=1.0, edge_frac=0.0),  # all under the stride floor, fewer in-box anchors than K
        dict(edge_frac=1.0, tiny_frac=0.0),  # corners and edges on anchor centres
        dict(pad_rows=12),  # all padding
        dict(cluster=False, int_labels=True),
    ],
    ids=["crowded", "tiny", "edges", "all_padding", "uniform_int_labels"],
)
def test_assign_rare_paths(library, device, obb, case):
    for k, k2 in ((13, None), (10, 3)):
        got, want = run_both(device, make_problem(21, obb, **case), num_classes=7, topk=k, topk2=k2)
        assert_matches(got, want, device == "cuda", f"{case} k={k} k2={k2}")


@pytest.mark.parametrize("device", devices())
def test_assign_k_larger_than_in_box_count(library, device):
    """K = 40 on small objects: every object's top-k takes zero-metric anchors, some inside it (docs/spec.md, the
    zero fill)."""
    inputs = make_problem(3, True, tiny_frac=0.6)
    got, want = run_both(device, inputs, num_classes=7, topk=40, topk2=20)
    assert_matches(got, want, device == "cuda")


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("obb", [False, True], ids=["hbb", "obb"])
def test_assign_no_objects(library, device, obb):
    scores, pd, anc, labels, gt, mask = make_problem(4, obb, score_dtype=torch.bfloat16)
    got, want = run_both(device, (scores, pd, anc, labels[:, :0], gt[:, :0], mask[:, :0]), num_classes=7, topk=10)
    assert_matches(got, want, True)
    assert (got[0] == 7).all() and not got[3].any()


@pytest.mark.parametrize("device", devices())
def test_assign_non_contiguous_inputs(library, device):
    scores, pd, anc, labels, gt, mask = to(device, make_problem(5, True))
    nc = (
        scores.transpose(1, 2).contiguous().transpose(1, 2),
        torch.cat((pd, pd), -1)[..., :5],
        anc.t().contiguous().t(),
        labels.expand(-1, -1, 1),
        gt.transpose(0, 1).contiguous().transpose(0, 1),
        mask.transpose(0, 1).contiguous().transpose(0, 1),
    )
    assert not any(t.is_contiguous() for t in (nc[0], nc[1], nc[2], nc[4]))
    want = reference.assign(scores, pd, anc, labels, gt, mask, stride=STRIDES, num_classes=7, topk=10)
    got = ops.assign(*nc, num_classes=7, topk=10, stride_val=16)
    assert_matches(got, want, device == "cuda")


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("obb", [False, True], ids=["hbb", "obb"])
@pytest.mark.parametrize("mask_2d", [False, True], ids=["mask3d", "mask2d"])
def test_assign_rows_sliced_from_one_targets_tensor(library, device, obb, mask_2d):
    """As the peer trainer passes them: gt_labels and gt_bboxes are slices of one (B, M, 1 + D) targets tensor and
    mask_gt a strided view; the op reads them as they are (the CUDA kernel without a copy)."""
    scores, pd, anc, labels, gt, mask = to(device, make_problem(9, obb))
    targets = torch.cat((labels, gt, mask), -1)
    D = gt.shape[-1]
    t_labels, t_gt = targets[..., :1], targets[..., 1:1 + D]
    t_mask = targets[..., 1 + D] if mask_2d else targets[..., 1 + D:]
    assert not any(t.is_contiguous() for t in (t_labels, t_gt, t_mask))
    want = reference.assign(scores, pd, anc, labels, gt, mask, stride=STRIDES, num_classes=7, topk=10)
    got = ops.assign(scores, pd, anc, t_labels, t_gt, t_mask, num_classes=7, topk=10, stride_val=16)
    assert_matches(got, want, device == "cuda")


@pytest.mark.parametrize("device", devices())
def test_assign_inputs_not_modified_and_outputs_constant(library, device):
    inputs = list(to(device, make_problem(6, False)))
    inputs[0].requires_grad_(True)
    inputs[1].requires_grad_(True)
    before = [t.detach().clone() for t in inputs]
    out = ops.assign(*inputs, num_classes=7, topk=10, topk2=5, stride_val=16)
    assert not any(t.requires_grad for t in out)
    for a, b in zip(inputs, before):
        assert torch.equal(a.detach(), b)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("anchor_dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_assign_narrow_anchors_are_widened_by_the_op(library, device, anchor_dtype):
    """Anchors of a narrower float type than the boxes (the peer's, under autocast) go to the op as they are; it
    widens them exactly, as the reference's type promotion does. Off-grid anchors, so that rounding shows."""
    inputs = list(to(device, make_problem(8, True)))
    inputs[2] = (inputs[2] + 0.3).to(anchor_dtype)
    kw = dict(num_classes=7, topk=10, topk2=3)
    want = reference.assign(*inputs, stride=STRIDES, **kw)
    got = ops.assign(*inputs, stride_val=reference.stride_value(STRIDES), **kw)
    assert_matches(got, want, device == "cuda")
    assert want[3].any()


def test_assign_bad_labels_are_an_error_on_cpu(library):
    scores, pd, anc, labels, gt, mask = make_problem(7, True)
    labels = labels.clone()
    labels[0, 0, 0] = 9  # a real object, num_classes is 7
    with pytest.raises(ValueError, match="gt_labels"):
        ops.assign(scores, pd, anc, labels, gt, mask, num_classes=7, topk=10, stride_val=16)


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda a: a.__setitem__(0, a[0][..., :3]), "num_classes"),
        (lambda a: a.__setitem__(1, a[1][..., :4]), "pd_bboxes"),
        (lambda a: a.__setitem__(2, a[2][:-1]), "anc_points"),
        (lambda a: a.__setitem__(3, a[3][:, :-1]), "gt_labels"),
        (lambda a: a.__setitem__(4, a[4].double()), "pd_bboxes"),
        (lambda a: a.__setitem__(2, a[2].double()), "anc_points"),  # wider than the boxes
        (lambda a: a.__setitem__(2, a[2].int()), "anc_points"),
        (lambda a: a.__setitem__(5, a[5][:1]), "mask_gt"),
    ],
)
def test_assign_bad_arguments_name_the_argument(library, change, match):
    args = list(make_problem(0, True))
    change(args)
    with pytest.raises((ValueError, TypeError), match=match):
        ops.assign(*args, num_classes=7, topk=10, stride_val=16)
    with pytest.raises(ValueError, match="topk"):
        ops.assign(*make_problem(0, True), num_classes=7, topk=0, stride_val=16)


# ---- the pass ops against the matching step of the reference ------------------------------------------------------
@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("obb", [False, True], ids=["hbb", "obb"])
def test_pass_ops_match_reference_steps(library, device, obb):
    scores, pd, anc, labels, gt, mask = to(device, make_problem(8, obb, n_boxes=30, pad_rows=5))
    exact = True  # the CPU kernels evaluate these steps bit for bit too (their transcendentals go through ATen)
    inside = reference.points_in_boxes(anc, gt, mask, 16)
    assert torch.equal(ops.points_in_boxes(anc, gt, mask, 16), inside)
    cand = inside & mask.bool()

    b, m, a = cand.nonzero(as_tuple=True)
    pair_want = reference.pair_overlaps(gt[b, m], pd[b, a])
    pair_got = ops.pair_overlaps(gt[b, m], pd[b, a])
    assert torch.equal(pair_got, pair_want) if exact else torch.allclose(pair_got, pair_want)
    assert (pair_want > 0).any()

    for alpha, beta in ((1.0, 6.0), (0.5, 6.0), (1.0, 2.0)):
        align_want, ov_want = reference.box_metrics(scores, pd, labels, gt, cand, alpha, beta)
        align_got, ov_got = ops.box_metrics(scores, pd, labels, gt, cand, alpha, beta)
        assert torch.equal(ov_got, ov_want)
        torch.testing.assert_close(align_got, align_want, rtol=CPU_SCORE_RTOL, atol=0)  # the pow of docs/spec.md
        assert align_got.dtype == align_want.dtype

    pos = reference.topk_mask(align_want, 10) & cand
    assert (pos.sum(1) > 1).any(), "the case must have conflicts"
    assert torch.equal(ops.resolve_conflicts(pos, ov_want), reference.resolve_conflicts(pos, ov_want))


def test_resolve_conflicts_ties_and_unclaimed_winner(library):
    """Ties go to the lower row; the winner need not have claimed the anchor; all-zero overlaps go to row 0."""
    pos = torch.tensor([[[True, True, False], [True, True, False], [False, False, True]]])
    ov = torch.tensor([[[0.2, 0.0, 0.5], [0.2, 0.0, 0.1], [0.9, 0.0, 0.3]]])
    got = ops.resolve_conflicts(pos, ov)
    want = torch.tensor([[[False, True, False], [False, False, False], [True, False, True]]])
    assert torch.equal(got, want)
    assert torch.equal(reference.resolve_conflicts(pos, ov), want)


# ---- opcheck: schema, fake kernel, autograd registration, dynamic shapes ----------------------------------------
def _opcheck_samples(device):
    samples = []
    for obb in (False, True):
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            problem = make_problem(9, obb, n_boxes=8, pad_rows=2, score_dtype=dtype)
            scores, pd, anc, labels, gt, mask = to(device, problem)
            samples.append((scores, pd, anc, labels, gt, mask, 10, 4, 7, 1.0, 6.0, 1e-9, 16.0))
        samples.append((scores, pd, anc, labels[:, :0], gt[:, :0], mask[:, :0], 10, 10, 7, 0.5, 6.0, 1e-9, 16.0))
    return samples


@pytest.mark.parametrize("device", devices())
def test_opcheck_assign(library, device):
    for args in _opcheck_samples(device):
        torch.library.opcheck(torch.ops.lucid.assign.default, args)


@pytest.mark.parametrize("device", devices())
def test_opcheck_pass_ops(library, device):
    for obb in (False, True):
        scores, pd, anc, labels, gt, mask = to(device, make_problem(10, obb, n_boxes=8, pad_rows=2))
        cand = reference.points_in_boxes(anc, gt, mask, 16) & mask.bool()
        b, m, a = cand.nonzero(as_tuple=True)
        torch.library.opcheck(torch.ops.lucid.pair_overlaps.default, (gt[b, m], pd[b, a]))
        torch.library.opcheck(torch.ops.lucid.box_metrics.default, (scores, pd, labels, gt, cand, 1.0, 6.0))
        align, ov = reference.box_metrics(scores, pd, labels, gt, cand, 1.0, 6.0)
        pos = reference.topk_mask(align, 10) & cand
        torch.library.opcheck(torch.ops.lucid.resolve_conflicts.default, (pos, ov))
        torch.library.opcheck(torch.ops.lucid.points_in_boxes.default, (anc, gt, mask, 16.0))


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("task", ["pose", "seg"])
def test_opcheck_pose_and_seg(library, device, task):
    problem = pose_problem if task == "pose" else seg_problem
    op = torch.ops.lucid.assign_pose.default if task == "pose" else torch.ops.lucid.assign_seg.default
    settings = (10, 4, 3, 0.5, 6.0, 1e-9, 16.0) + ((2.0, 12.0) if task == "pose" else ())
    for trainer_dtypes in (False, True):
        inputs = problem(12, objects=(3, 8), trainer_dtypes=trainer_dtypes, device=device)
        torch.library.opcheck(op, (*inputs, *settings))
    empty = [t[:, :0] if i in (3, 4, 5) or (task == "pose" and i == 8) else t for i, t in enumerate(inputs)]
    torch.library.opcheck(op, (*empty, *settings))


# ---- torch.compile ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", devices())
def test_compile_fullgraph_matches_eager(library, device):
    scores, pd, anc, labels, gt, mask = to(device, make_problem(11, True))
    scores.requires_grad_(True)

    def loss(scores, pd, anc, labels, gt, mask):
        t_labels, t_boxes, t_scores, fg, idx = ops.assign(
            scores.detach().sigmoid(), pd.detach(), anc, labels, gt, mask, num_classes=7, topk=10, stride_val=16
        )
        bce = torch.nn.functional.binary_cross_entropy_with_logits(scores, t_scores, reduction="sum")
        return bce / t_scores.sum().clamp(min=1), fg.sum(), idx

    torch._dynamo.reset()
    compiled = torch.compile(loss, fullgraph=True)
    # compiled first: older Inductors (torch 2.4) build their CPU kernels with -ffast-math, and loading them sets
    # flush-to-zero for the whole process, which the eager run must share
    traced = compiled(scores, pd, anc, labels, gt, mask)
    eager = loss(scores, pd, anc, labels, gt, mask)
    assert torch.equal(eager[1], traced[1]) and torch.equal(eager[2], traced[2])
    torch.testing.assert_close(traced[0], eager[0])
    traced[0].backward()
    assert scores.grad is not None and torch.isfinite(scores.grad).all()
