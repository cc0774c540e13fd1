"""The rules of docs/spec.md checked on the reference directly, and proof that the random suite reaches the rare paths
(otherwise agreement with the peer would prove little)."""

import pytest
import torch

from lucid_assign import reference

from cases import STRIDES, anchor_points, make_problem


def test_topk_mask_ties_go_to_lower_index():
    x = torch.tensor([[0.0, 3.0, 1.0, 3.0, 0.0, 1.0, 3.0, 0.0]])
    assert reference.topk_mask(x, 2).nonzero()[:, 1].tolist() == [1, 3]
    assert reference.topk_mask(x, 4).nonzero()[:, 1].tolist() == [1, 2, 3, 6]
    # zero fill: fewer positive values than k take the lowest-indexed zeros
    y = torch.tensor([[0.0, 0.0, 0.5, 0.0, 0.0]])
    assert reference.topk_mask(y, 3).nonzero()[:, 1].tolist() == [0, 1, 2]


def test_topk_mask_nan_ranks_first():
    x = torch.tensor([[1.0, float("nan"), 2.0, float("nan")]])
    assert reference.topk_mask(x, 1).nonzero()[:, 1].tolist() == [1]
    assert reference.topk_mask(x, 3).nonzero()[:, 1].tolist() == [1, 2, 3]


def test_hbb_edges_are_outside_obb_edges_inside():
    anc = torch.tensor([[4.0, 4.0], [12.0, 12.0], [20.0, 12.0], [28.0, 12.0]])
    mask = torch.ones(1, 1, 1)
    hbb = torch.tensor([[[4.0, 4.0, 20.0, 20.0]]])  # anchors 0 and 2 sit on its edges
    assert reference.points_in_boxes(anc, hbb, mask, 16).tolist() == [[[False, True, False, False]]]
    obb = torch.tensor([[[12.0, 12.0, 16.0, 16.0, 0.0]]])  # the same square, closed test
    assert reference.points_in_boxes(anc, obb, mask, 16).tolist() == [[[True, True, True, False]]]


def test_stride_floor_only_for_real_objects():
    anc = anchor_points(64)
    box = torch.tensor([[[30.0, 30.0, 31.0, 31.0]]])  # 1 px: no anchor centre inside without the floor
    inside_real = reference.points_in_boxes(anc, box, torch.ones(1, 1, 1), 16)
    inside_pad = reference.points_in_boxes(anc, box, torch.zeros(1, 1, 1), 16)
    assert inside_real.sum() > 0 and inside_pad.sum() == 0


def _steps(inputs, topk):
    scores, pd, anc, labels, gt, mask = inputs
    valid = mask.bool()
    inside = reference.points_in_boxes(anc, gt, mask, reference.stride_value(STRIDES))
    align, ov = reference.box_metrics(scores, pd, labels, gt, inside & valid, 1.0, 6.0)
    pos = reference.topk_mask(align, topk) & inside & valid
    return inside, align, ov, pos


def test_suite_reaches_rare_paths():
    """Across the seeds of the peer comparison: conflicts, zero-fill positives, conflicts won by a row that did not
    claim the anchor, and positives of objects smaller than the floor all occur."""
    seen = dict(conflict=0, zero_fill=0, won_unclaimed=0, tiny_positive=0)
    for seed in range(3):
        for obb in (False, True):
            inputs = make_problem(seed, obb, num_classes=7)
            inside, align, ov, pos = _steps(inputs, 10)
            multi = pos.sum(1) > 1
            seen["conflict"] += int(multi.sum())
            seen["zero_fill"] += int((pos & (align == 0)).sum())
            resolved = reference.resolve_conflicts(pos, ov)
            seen["won_unclaimed"] += int((resolved & ~pos).sum())
            gt = inputs[4]
            wh = gt[..., 2:4] if obb else gt[..., 2:] - gt[..., :2]
            tiny = (wh < 16).any(-1) & inputs[5][..., 0].bool()
            seen["tiny_positive"] += int((pos.any(-1) & tiny).sum())
    assert all(v > 0 for v in seen.values()), seen


def test_background_rows_take_row_zero():
    inputs = make_problem(4, False, num_classes=7)
    labels, boxes, scores, fg, idx = reference.assign(*inputs, stride=STRIDES, num_classes=7, topk=10)
    bg = ~fg
    assert bg.any() and fg.any()
    assert (idx[bg] == 0).all()
    row0_label = inputs[3][:, 0, 0].long()[:, None].expand_as(labels)
    assert torch.equal(labels[bg], row0_label[bg])
    assert (scores[bg] == 0).all()


@pytest.mark.parametrize("obb", [False, True])
def test_module_matches_functional(obb):
    from lucid_assign import RotatedTaskAlignedAssigner, TaskAlignedAssigner

    inputs = make_problem(8, obb, num_classes=7)
    cls = RotatedTaskAlignedAssigner if obb else TaskAlignedAssigner
    out = cls(topk=10, num_classes=7, stride=list(STRIDES), backend="reference")(*inputs)
    ref = reference.assign(*inputs, topk=10, num_classes=7, stride=STRIDES)
    for a, b in zip(out, ref):
        assert torch.equal(a, b)


def test_rotated_module_rejects_hbb():
    from lucid_assign import RotatedTaskAlignedAssigner

    inputs = make_problem(8, False, num_classes=7)
    with pytest.raises(ValueError, match="gt_bboxes"):
        RotatedTaskAlignedAssigner(num_classes=7)(*inputs)


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda a: a.__setitem__(0, a[0][..., :3]), "num_classes"),
        (lambda a: a.__setitem__(2, a[2][:-1]), "anc_points"),
        (lambda a: a.__setitem__(4, a[4][..., :3]), "gt_bboxes"),
        (lambda a: a.__setitem__(5, a[5][:, :-1]), "mask_gt"),
    ],
)
def test_functional_rejects_bad_shapes(mutate, match):
    import lucid_assign

    args = list(make_problem(0, False, num_classes=7))
    mutate(args)
    with pytest.raises(ValueError, match=match):
        lucid_assign.assign(*args, num_classes=7, topk=10)


def test_functional_rejects_bad_topk():
    import lucid_assign

    args = make_problem(0, False, num_classes=7)
    with pytest.raises(ValueError, match="topk"):
        lucid_assign.assign(*args, num_classes=7, topk=0)
    with pytest.raises(ValueError, match="topk"):
        lucid_assign.assign(*args, num_classes=7, topk=10_000)
