"""Dense scenes (xView, SKU-110K: thousands of small objects per image) and step 4 at thousands of rows, against the
reference on every device: an anchor claimed by several rows goes to the first row with the largest overlap over all
M rows, which the kernels find without scanning the rows (CUDA) or by scanning them (CPU); the structures below are
the ones where a shortcut could differ: ties between thousands of rows, all-zero overlaps (the first row wins, even
a padding row or one that does not contain the anchor), NaN overlaps (the first NaN wins), conflicts with the rows in
any order."""

import math

import pytest
import torch

from lucid_assign import __main__ as cli
from lucid_assign import bench, ops, reference
from lucid_assign.synthetic import anchor_points, dense_batch

from cases import STRIDES
from conftest import devices
from contract import assert_matches

INPUTS = reference.INPUTS


def run(device, inputs, **kw):
    """The op against the reference: exact on CUDA; on the CPU the scores to a relative 1e-6 (docs/spec.md). NaN
    scores (an image with a NaN overlap) must be NaN in both."""
    kw = dict(dict(topk=10, alpha=0.5, beta=6.0), **kw)
    inputs = [t.to(device) for t in inputs]
    want = reference.assign(*inputs, stride=STRIDES, **kw)
    got = ops.assign(*inputs, stride_val=reference.stride_value(STRIDES), **kw)
    nan = want[2].isnan()
    assert torch.equal(got[2].isnan(), nan), "NaN scores differ"
    clean = lambda out: (*out[:2], out[2].masked_fill(nan, 0), *out[3:])  # noqa: E731
    assert_matches(clean(got), clean(want), exact=device == "cuda")
    return got


def conflicted_anchors(inputs, topk=10, alpha=0.5, beta=6.0):
    """How many anchors the dense form's top-k gives to two or more rows (what step 4 resolves)."""
    scores, pd, anc, labels, gt, mask = (t.cpu() for t in inputs)
    cand = reference.points_in_boxes(anc, gt, mask, reference.stride_value(STRIDES)) & mask.bool()
    align, _ = reference.box_metrics(scores, pd, labels, gt, cand, alpha, beta)
    pos = reference.topk_mask(align, topk) & cand
    return int((pos.sum(1) > 1).sum())


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("obb", [False, True], ids=["hbb", "obb"])
def test_dense_scene_at_the_presets_density(library, device, obb):
    """The xView-like preset's density (2,500-5,000 objects on 640 px) on a 320 px slice: 625-1,250 objects an image."""
    b = dense_batch(batch=2, img_size=320, num_classes=60 if not obb else 15, objects=(625, 1250), obb=obb, seed=11)
    inputs = [b[k] for k in INPUTS]
    assert conflicted_anchors(inputs) > 100, "the scene resolves many conflicts"
    got = run(device, inputs, num_classes=inputs[0].shape[-1])
    assert got[3].sum() > 1000


@pytest.mark.cuda
@pytest.mark.parametrize("preset", sorted(bench.PRESETS))
def test_dense_preset_slice_on_cuda(library, preset):
    """Two images of each benchmark preset at full size and density (up to 5,000 objects), bit for bit."""
    p = bench.PRESETS[preset]
    spec = bench.KINDS[p["kind"]]
    b = dense_batch(batch=2, img_size=spec["img_size"], num_classes=p["classes"], objects=p["objects"],
                    obb=spec["obb"], seed=3)
    got = run("cuda", [b[k] for k in INPUTS], num_classes=p["classes"])
    assert got[3].sum() > 5000


def crowd(n_rows, img=320, obb=False, seed=0, far=False, nan_preds=0.0, classes=5):
    """One image: n_rows objects piled on four spots (each anchor there lies in hundreds of rows), rows in random
    order, a fifth of them exact duplicates; predictions near every anchor, a share of them NaN. far: no prediction
    overlaps anything, so every metric is 0 and each row's top-k is the lowest-indexed anchors; the spots are then
    on the image's first rows of anchors, so that those are candidates of many rows."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda *s: torch.rand(*s, generator=g)  # noqa: E731
    anc = anchor_points(img)
    A = anc.shape[0]
    spots = (torch.tensor([[20.0, 8.0], [40.0, 6.0], [60.0, 10.0], [30.0, 12.0]]) if far
             else rand(4, 2) * img * 0.6 + img * 0.2)
    ctr = spots[torch.randint(0, 4, (n_rows,), generator=g)] + (rand(n_rows, 2) - 0.5) * 30
    wh = 8 + rand(n_rows, 2) * 40
    dup = rand(n_rows) < 0.2  # a fifth repeat the row before them
    for i in range(1, n_rows):
        if dup[i]:
            ctr[i], wh[i] = ctr[i - 1], wh[i - 1]
    if obb:
        gt = torch.cat((ctr, wh, (rand(n_rows, 1) - 0.5) * math.pi), -1)
    else:
        gt = torch.cat((ctr - wh / 2, ctr + wh / 2), -1)
    pc = anc + (rand(A, 2) - 0.5) * 8 + (5000 if far else 0)
    pwh = 10 + rand(A, 2) * 30
    pd = torch.cat((pc, pwh, (rand(A, 1) - 0.5) * math.pi), -1) if obb else torch.cat((pc - pwh / 2, pc + pwh / 2), -1)
    pd[rand(A) < nan_preds] = float("nan")
    labels = (rand(n_rows, 1) * classes).floor()
    mask = torch.ones(n_rows, 1)
    scores = rand(A, classes) ** 2
    return [scores[None], pd[None], anc, labels[None], gt[None], mask[None]]


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("obb", [False, True], ids=["hbb", "obb"])
@pytest.mark.parametrize("case", ["near", "far", "nan", "padding-first"])
def test_conflicts_among_thousands_of_rows(library, device, obb, case):
    """3,000 rows on four spots: near (overlaps decide, duplicates tie and the lower row wins), far (every overlap 0:
    each conflicted anchor goes to row 0), nan (NaN overlaps win, the first one), padding-first (row 0 is padding and
    lies elsewhere, and overlaps are 0: row 0 still wins, as in the dense form)."""
    inputs = crowd(3000, obb=obb, seed=5, far=case in ("far", "padding-first"), nan_preds=0.05 if case == "nan" else 0)
    if case == "padding-first":  # row 0: padding, far from the spots
        inputs[5][0, 0] = 0
        inputs[4][0, 0] = torch.tensor([300.0, 300.0, 10.0, 10.0, 0.0] if obb else [290.0, 290.0, 310.0, 310.0])
    # with every metric 0, every row's top-k is the same 10 anchors
    assert conflicted_anchors(inputs) >= (5 if case in ("far", "padding-first") else 50)
    got = run(device, inputs, num_classes=5)
    if case in ("far", "padding-first"):
        assert (got[4][got[3]] == 0).any(), "conflicts resolved to row 0"


def test_bench_dense_preset(tmp_path, capsys):
    """`lucid-assign bench --preset xview` on a smaller batch: the dense scene, its range of objects, the table."""
    out = tmp_path / "b.json"
    rc = cli.main(["bench", "--preset", "xview", "--batch", "1", "--objects", "400", "--reps", "1", "--device", "cpu",
                   "--backends", "reference", "--no-progress", "--out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "dense scene: xview" in text and "HBB at 640 px, 60 classes, batch 1" in text
    import json

    rows = json.loads(out.read_text())["results"]
    assert rows[0]["scene"] == "dense" and rows[0]["objects"] == 400 and rows[0]["classes"] == 60
