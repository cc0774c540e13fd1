"""The containment op torch.ops.lucid.points_in_boxes against the reference (step 1 of docs/spec.md)."""

import pytest
import torch

from lucid_assign import reference

from cases import anchor_points, make_problem
from conftest import devices


def _inputs(seed, obb, device, dtype=torch.float32):
    _, _, anc, _, gt, mask = make_problem(seed, obb, batch=3, n_boxes=16, img_size=128)
    return anc.to(device, dtype), gt.to(device, dtype), mask.to(device)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("obb", [False, True], ids=["hbb", "obb"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("seed", range(4))
def test_matches_reference(library, device, obb, dtype, seed):
    anc, gt, mask = _inputs(seed, obb, device, dtype)
    for stride_val in (16, 12.5):
        got = library.points_in_boxes(anc, gt, mask, stride_val)
        want = reference.points_in_boxes(anc, gt, mask, stride_val)
        assert got.dtype == torch.bool and got.shape == want.shape
        assert torch.equal(got, want), f"{(got != want).sum().item()} anchors differ"
        assert got.any() and not got.all()


@pytest.mark.parametrize("device", devices())
def test_anchors_on_edges(library, device):
    """Anchors exactly on box edges: outside for HBB (strict, after the centre/size round trip), inside for OBB."""
    anc = anchor_points(64).to(device)
    xs = torch.tensor([4.0, 12.0, 20.0, 28.0, 36.0])
    x1, y1 = (t.flatten() for t in torch.meshgrid(xs, xs, indexing="ij"))
    hbb = torch.stack((x1, y1, x1 + 16, y1 + 16), -1)[None].to(device)
    centre = (hbb[..., :2] + hbb[..., 2:]) / 2
    obb = torch.cat((centre, hbb[..., 2:] - hbb[..., :2], torch.zeros_like(centre[..., :1])), -1)
    mask = torch.ones(1, hbb.shape[1], 1, device=device)
    for boxes in (hbb, obb):
        got = library.points_in_boxes(anc, boxes, mask, 16)
        want = reference.points_in_boxes(anc, boxes, mask, 16)
        assert torch.equal(got, want)
    # 16 px boxes with edges on level-0 anchors (8 px apart): HBB holds the one strictly interior anchor, OBB the
    # closed 3x3 set
    level0 = slice(0, 64)
    assert (reference.points_in_boxes(anc, hbb, mask, 16)[..., level0].sum(-1) == 1).all()
    assert (reference.points_in_boxes(anc, obb, mask, 16)[..., level0].sum(-1) == 9).all()


@pytest.mark.parametrize("device", devices())
def test_padding_rows_are_not_floored(library, device):
    anc = anchor_points(64).to(device)
    box = torch.tensor([[[30.0, 30.0, 31.0, 31.0], [30.0, 30.0, 31.0, 31.0]]], device=device)
    mask = torch.tensor([[[1.0], [0.0]]], device=device)
    got = library.points_in_boxes(anc, box, mask, 16)
    assert got[0, 0].sum() > 0 and got[0, 1].sum() == 0
    assert torch.equal(got, reference.points_in_boxes(anc, box, mask, 16))


@pytest.mark.parametrize("device", devices())
def test_empty_and_bool_mask(library, device):
    anc, gt, mask = _inputs(0, True, device)
    assert library.points_in_boxes(anc, gt[:, :0], mask[:, :0], 16).shape == (3, 0, anc.shape[0])
    assert torch.equal(
        library.points_in_boxes(anc, gt, mask.bool(), 16), library.points_in_boxes(anc, gt, mask[..., 0], 16)
    )


@pytest.mark.parametrize("device", devices())
def test_non_contiguous_inputs(library, device):
    anc, gt, mask = _inputs(1, True, device)
    gt_nc = gt.transpose(0, 1).contiguous().transpose(0, 1)
    assert not gt_nc.is_contiguous()
    anc_nc = anc.t().contiguous().t()
    assert torch.equal(library.points_in_boxes(anc_nc, gt_nc, mask, 16), reference.points_in_boxes(anc, gt, mask, 16))


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize(
    "change, match",
    [
        (dict(anc=lambda a: a[:, :1]), "anc_points"),
        (dict(gt=lambda g: g[..., :3]), "gt_bboxes"),
        (dict(gt=lambda g: g.half()), "gt_bboxes"),
        (dict(anc=lambda a: a.double()), "anc_points"),
        (dict(mask=lambda m: m[:, :-1]), "mask_gt"),
        (dict(stride=-1.0), "stride_val"),
    ],
)
def test_bad_arguments_name_the_argument(library, device, change, match):
    anc, gt, mask = _inputs(0, True, device)
    anc = change.get("anc", lambda a: a)(anc)
    gt = change.get("gt", lambda g: g)(gt)
    mask = change.get("mask", lambda m: m)(mask)
    with pytest.raises((ValueError, TypeError), match=match):
        library.points_in_boxes(anc, gt, mask, change.get("stride", 16.0))


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("obb", [False, True], ids=["hbb", "obb"])
def test_opcheck(library, device, obb):
    anc, gt, mask = _inputs(2, obb, device)
    torch.library.opcheck(torch.ops.lucid.points_in_boxes.default, (anc, gt, mask, 16.0))
    torch.library.opcheck(torch.ops.lucid.points_in_boxes.default, (anc, gt[:, :0], mask[:, :0], 8.0))


def test_inputs_not_modified(library):
    anc, gt, mask = _inputs(3, True, "cpu")
    before = [t.clone() for t in (anc, gt, mask)]
    library.points_in_boxes(anc, gt, mask, 16)
    for a, b in zip((anc, gt, mask), before):
        assert torch.equal(a, b)
