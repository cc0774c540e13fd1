"""The CUDA assign sorts object rows by their number of candidates: a warp per row for up to 64, a block with a
shared-memory list for up to 4,096 (found through a bitmap of the anchors, or sorted when the anchors are too many
for it), a big-row kernel with a list in dynamic shared memory beyond that, and the
recompute walk over all anchors when even that list is too small (more anchors than fit, as at 1280 px) or the cell
index cannot be used (a non-finite box). Every path, with positive, zero and negative metrics at the k-th place,
must equal the reference on CUDA bit for bit. Skipped without a GPU."""

import math

import pytest
import torch

from lucid_assign import ops, reference
from lucid_assign.synthetic import anchor_points

from cases import STRIDES

pytestmark = pytest.mark.cuda


def scene(img, sizes, obb, seed, far=False, negative=False, nan_row=None, classes=5, device="cuda"):
    """One image per entry of ``sizes`` (a list of box sides per image): boxes centred at random, predictions near
    every anchor (or far away with ``far``: overlaps 0, metrics 0), scores in [0, 1) (shifted by -0.5 with
    ``negative``, so metrics < 0 with alpha 1)."""
    g = torch.Generator().manual_seed(seed)
    anc = anchor_points(img)
    A = anc.shape[0]
    B, M = len(sizes), max(len(s) for s in sizes)
    D = 5 if obb else 4
    gt = torch.zeros(B, M, D)
    mask = torch.zeros(B, M, 1)
    for b, row in enumerate(sizes):
        for m, side in enumerate(row):
            c = torch.rand(2, generator=g) * img
            wh = torch.tensor([side, side * (0.5 + torch.rand(1, generator=g).item())])
            if obb:
                gt[b, m] = torch.cat((c, wh, (torch.rand(1, generator=g) - 0.5) * math.pi))
            else:
                gt[b, m] = torch.cat((c - wh / 2, c + wh / 2))
            mask[b, m] = 1
    if nan_row is not None:
        gt[nan_row] = float("nan")
    labels = (torch.rand(B, M, 1, generator=g) * classes).floor() * mask
    ctr = anc[None] + (torch.rand(B, A, 2, generator=g) - 0.5) * 8 + (5000 if far else 0)
    wh = 6 + torch.rand(B, A, 2, generator=g) * 60
    if obb:
        pd = torch.cat((ctr, wh, (torch.rand(B, A, 1, generator=g) - 0.5) * math.pi), -1)
    else:
        pd = torch.cat((ctr - wh / 2, ctr + wh / 2), -1)
    scores = torch.rand(B, A, classes, generator=g) ** 2
    scores[torch.rand(B, A, classes, generator=g) < 0.05] = 0  # ties
    if negative:
        scores = scores - 0.5
    return [t.to(device) for t in (scores, pd, anc, labels, gt, mask)]


def check(inputs, strides=STRIDES, **kw):
    kw = dict(dict(num_classes=5, topk=10, alpha=0.5, beta=6.0), **kw)
    got = ops.assign(*inputs, stride_val=reference.stride_value(strides), **kw)
    want = reference.assign(*inputs, stride=strides, **kw)
    names = ("target_labels", "target_bboxes", "target_scores", "fg_mask", "target_gt_idx")
    for name, a, b in zip(names, got, want):
        assert a.dtype == b.dtype and torch.equal(a, b), f"{name}: {(a != b).sum().item()} differ"
    return got


# per image: box sides that give rows of every size class at 1024 px (21,504 anchors): a few px (under the stride
# floor), ~20-30 candidates, a few hundred, ~1,000-3,000 (the block's list), 4,000-7,000 (big rows), and one covering
# nearly the image; HBB and OBB both have rows of 2,049-4,096 candidates
MIXED = [[4, 12, 30, 60, 150, 260, 330, 700], [6, 40, 90, 400, 1500, 520], [8, 20, 2000, 3, 3, 3]]


@pytest.mark.parametrize("obb", [False, True], ids=["hbb", "obb"])
@pytest.mark.parametrize("topk", [(10, None), (40, None), (13, 3)], ids=["k10", "k40", "k13k2=3"])
def test_every_row_size(library, obb, topk):
    k, k2 = topk
    out = check(scene(1024, MIXED, obb, seed=1), topk=k, topk2=k2)
    assert out[3].any()


# box sides whose rows have about 64 candidates, the most a warp ranks (rows beyond go to a block)
NEAR_WARP_CAP = [[44 + 2 * i for i in range(10)], [45 + 2 * i for i in range(10)]]


@pytest.mark.parametrize("obb", [False, True], ids=["hbb", "obb"])
@pytest.mark.parametrize("topk", [(10, None), (300, None), (13, 3)], ids=["k10", "k300", "k13k2=3"])
def test_rows_about_the_warp_cap(library, obb, topk):
    inputs = scene(1024, NEAR_WARP_CAP, obb, seed=3)
    n = ops.points_in_boxes(inputs[2], inputs[4], inputs[5], reference.stride_value(STRIDES)).sum(-1).flatten()
    assert ((n > 48) & (n <= 64)).any() and ((n > 64) & (n <= 80)).any(), "the scene straddles the cap"
    k, k2 = topk
    out = check(inputs, topk=k, topk2=k2)
    assert out[3].any()


@pytest.mark.parametrize("topk", [(10, None), (13, 3)], ids=["k10", "k13k2=3"])
def test_thin_diagonal_rows(library, topk):
    """Long thin oriented boxes near 45 degrees under a side floor of 4 px: a warp's worth of candidates but hundreds
    of anchors under their bounding box, so a block walks them (rows with more than 512 anchors under their cells
    leave the warp path)."""
    g = torch.Generator().manual_seed(9)
    inputs = scene(1024, [[20] * 6, [20] * 6], True, seed=9)
    gt = inputs[4].cpu()
    lengths = torch.tensor([[300.0, 320, 340, 360, 60, 30], [380, 400, 280, 50, 310, 20]])
    gt[..., 2], gt[..., 3] = lengths, 3.0
    gt[..., 4] = math.pi / 4 + (torch.rand(2, 6, generator=g) - 0.5) * 0.1
    gt[..., :2] = 300 + torch.rand(2, 6, 2, generator=g) * 400
    inputs[4] = gt.cuda()
    anc = inputs[2]
    n = ops.points_in_boxes(anc, inputs[4], inputs[5], 4.0).sum(-1)
    half = (lengths[..., None] * 0.5 * math.sqrt(0.5)).cuda()  # about half the side of the bounding box
    near = ((anc[None, None] - inputs[4][..., None, :2]).abs() <= half[..., None]).all(-1).sum(-1)
    assert ((n <= 64) & (near > 512)).sum() >= 4, "rows with a warp's worth of candidates under a wide bounding box"
    k, k2 = topk
    out = check(inputs, strides=(4,), topk=k, topk2=k2)
    assert out[3].any()


@pytest.mark.parametrize("obb", [False, True], ids=["hbb", "obb"])
@pytest.mark.parametrize("k2", [1, 3, 32, 33])
@pytest.mark.parametrize("metrics", ["near", "far", "negative"])
def test_second_topk_over_owned_anchors(library, obb, k2, metrics):
    """The second top-k ranks each row's owned anchors: a warp per row owning up to 32, the walk over all anchors
    beyond (top-k 40 lets rows own more), with positive, zero and negative metrics at the k2-th place."""
    inputs = scene(1024, MIXED, obb, seed=7, far=metrics == "far", negative=metrics == "negative")
    out = check(inputs, topk=40, topk2=k2, alpha=1.0)
    assert out[3].any()


@pytest.mark.parametrize("obb", [False, True], ids=["hbb", "obb"])
def test_zero_metrics_at_the_kth_place(library, obb):
    """Predictions far from every object: every overlap is 0, so each row's top-k is the lowest-indexed anchors,
    candidates or not, in rows of every size."""
    out = check(scene(1024, MIXED, obb, seed=2, far=True))
    assert out[3].any()


@pytest.mark.parametrize("obb", [False, True], ids=["hbb", "obb"])
@pytest.mark.parametrize("alpha", [1.0, 2.0])
def test_negative_metrics(library, obb, alpha):
    """Scores below 0 (alpha 1: negative metrics, which rank below the zero of the non-candidates)."""
    check(scene(1024, MIXED, obb, seed=3, negative=True), alpha=alpha)


@pytest.mark.parametrize("obb", [False, True], ids=["hbb", "obb"])
@pytest.mark.parametrize("far", [False, True], ids=["near", "far"])
def test_more_candidates_than_shared_memory(library, obb, far):
    """1280 px (33,600 anchors): a box over the whole image has more candidates than the big-row list holds on an
    H200, and takes the recompute walk."""
    check(scene(1280, [[3000, 50, 8], [2500]], obb, seed=4, far=far))


@pytest.mark.parametrize("obb", [False, True], ids=["hbb", "obb"])
def test_more_anchors_than_the_bitmap_holds(library, obb):
    """1920 px (75,600 anchors): the block's bitmap of a row's candidates holds 65,536 anchors, so medium rows find
    their candidates in anchor order by sorting them instead."""
    check(scene(1920, [[90, 160, 260, 20, 6], [330, 120]], obb, seed=8))


@pytest.mark.parametrize("obb", [False, True], ids=["hbb", "obb"])
def test_non_finite_box_rows(library, obb):
    """A real object whose box is NaN has no usable cell range: the block scans every anchor (none inside)."""
    check(scene(1024, MIXED, obb, seed=5, nan_row=(0, 2)))


@pytest.mark.parametrize("setting", [dict(topk=10), dict(topk=40, topk2=3)], ids=["k10", "k40k2=3"])
def test_many_small_rows_graph_replay(library, setting):
    """Row lists (and the second top-k's owned lists) are rebuilt on every replay of a captured graph."""
    inputs = scene(1024, [[3 + (i * 37) % 500 for i in range(120)] for _ in range(4)], True, seed=6)
    kw = dict(num_classes=5, stride_val=16.0, **setting)
    static = [t.clone() for t in inputs]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        ops.assign(*static, **kw)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = ops.assign(*static, **kw)
    other = scene(1024, [[3 + (i * 53) % 700 for i in range(120)] for _ in range(4)], True, seed=7)
    for case in (other, inputs):
        for dst, src in zip(static, case):
            dst.copy_(src)
        graph.replay()
        want = reference.assign(*case, stride=STRIDES, num_classes=5, **setting)
        for a, b in zip(captured, want):
            assert torch.equal(a, b)


def test_alternating_anchor_counts(library):
    """The big-row kernel's shared-memory limit follows the largest anchor count seen; a call with fewer anchors in
    between must not lower it under the next large call (seen as 'invalid argument' before the fix)."""
    for img in (1024, 64, 1024, 128, 1280, 1024):
        check(scene(img, [[img * 3, 20, 5]], True, seed=img))


@pytest.mark.parametrize("obb", [False, True], ids=["hbb", "obb"])
def test_medium_block_sizes(library, obb):
    """The medium rows' block has 1,024, 512 or 256 threads by the number of object rows per multiprocessor (at most
    2, at most 64, more): the same objects with padding rows added to reach each size give the same outputs, which
    equal the reference's without padding."""
    inputs = scene(1024, MIXED, obb, seed=10)
    kw = dict(num_classes=5, topk=10, alpha=0.5, beta=6.0)
    want = check(inputs, **kw)
    B, M = inputs[4].shape[:2]
    sms = torch.cuda.get_device_properties(inputs[0].device).multi_processor_count
    # rows per multiprocessor, ceil(B * m / sms): at most 2, at most 64 (and above 63 for B < sms), above 64
    for m in (max(M, 2 * sms // B), 64 * sms // B, 64 * sms // B + 1):
        padded = list(inputs)
        for i in (3, 4, 5):
            extra = torch.zeros(B, m - M, *inputs[i].shape[2:], dtype=inputs[i].dtype, device=inputs[i].device)
            padded[i] = torch.cat((inputs[i], extra), 1)
        got = ops.assign(*padded, stride_val=reference.stride_value(STRIDES), **kw)
        for name, a, b in zip(("labels", "bboxes", "scores", "fg", "gt_idx"), got, want):
            assert torch.equal(a, b), f"{B * m} rows on {sms} multiprocessors: {name} differs"
