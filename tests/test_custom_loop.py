"""Your own training loop: `lucid_assign.pad_targets` from a trainer's flat targets to the op's padded inputs, and
examples/train_obb.py, which trains an oriented-box detector with `torch.ops.lucid.assign` and no trainer."""

import importlib.util
import os

import numpy as np
import pytest
import torch

import lucid_assign

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def _flat(batch, counts, box_dim, seed=0, shuffle=True):
    """Flat rows (image index, class, box) with counts[b] rows for image b, in a shuffled order."""
    g = torch.Generator().manual_seed(seed)
    image = torch.cat([torch.full((n,), float(b)) for b, n in enumerate(counts)])
    rows = torch.cat([image[:, None], torch.randint(0, 7, (len(image), 1), generator=g).float(),
                      torch.rand(len(image), box_dim, generator=g) * 100], 1)
    return rows[torch.randperm(len(rows), generator=g)] if shuffle else rows


def _padded_by_loop(rows, batch):
    """The padding written as a plain loop over images: the oracle."""
    per_image = [rows[rows[:, 0] == b] for b in range(batch)]
    m = max((len(p) for p in per_image), default=0)
    labels = torch.zeros(batch, m, 1)
    boxes = torch.zeros(batch, m, rows.shape[1] - 2)
    mask = torch.zeros(batch, m, 1, dtype=torch.bool)
    for b, p in enumerate(per_image):
        labels[b, :len(p), 0] = p[:, 1]
        boxes[b, :len(p)] = p[:, 2:]
        mask[b, :len(p)] = True
    return labels, boxes, mask


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("box_dim", [4, 5])
@pytest.mark.parametrize("counts", [[3, 0, 5, 1], [0, 0], [2], [7, 7, 0, 1, 4]])
def test_pad_targets_equals_a_loop_over_images(device, box_dim, counts):
    rows = _flat(len(counts), counts, box_dim)
    before = rows.clone()
    want = _padded_by_loop(rows, len(counts))
    got = lucid_assign.pad_targets(rows.to(device), len(counts))
    assert torch.equal(rows, before)
    if device == "cpu":  # on the CPU the padding is the largest count
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and torch.equal(g, w)
    else:  # on a GPU, N rows (no count is read); the rows past the largest count are padding
        m = want[0].shape[1]
        for g, w in zip(got, want):
            assert g.shape[1] == len(rows) and g.device.type == "cuda"
            assert torch.equal(g[:, :m].cpu(), w) and not g[:, m:].any()


@pytest.mark.parametrize("device", DEVICES)
def test_pad_targets_to_another_device_and_a_fixed_width(device):
    rows = _flat(3, [2, 4, 1], 5)
    labels, boxes, mask = lucid_assign.pad_targets(rows, 3, max_objects=6, device=device)
    want = _padded_by_loop(rows, 3)
    assert labels.device.type == device and labels.shape == (3, 6, 1) and boxes.shape == (3, 6, 5)
    assert torch.equal(boxes[:, :4].cpu(), want[1]) and not mask[:, 4:].any()


def test_pad_targets_refuses_bad_rows_and_settings():
    rows = _flat(2, [2, 3], 4, shuffle=False)
    with pytest.raises(ValueError, match=r"targets must be \(N, 6\) or \(N, 7\)"):
        lucid_assign.pad_targets(rows[:, :5], 2)
    with pytest.raises(TypeError, match="targets must be a float16, bfloat16, float32 or float64 tensor"):
        lucid_assign.pad_targets(rows.long(), 2)
    with pytest.raises(ValueError, match="batch_size must be an integer >= 0"):
        lucid_assign.pad_targets(rows, -1)
    with pytest.raises(ValueError, match="max_objects must be an integer >= 0"):
        lucid_assign.pad_targets(rows, 2, max_objects=2.5)
    with pytest.raises(ValueError, match="batch_size must be an integer >= 0"):
        lucid_assign.pad_targets(rows, True)
    # NumPy integers and one-element integer tensors are integers
    want = lucid_assign.pad_targets(rows, 2, max_objects=4)
    got = lucid_assign.pad_targets(rows, np.int64(2), max_objects=torch.tensor(4))
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    with pytest.raises(ValueError, match=r"targets\[2, 0\] must be an image index in \[0, batch_size\) = \[0, 1\)"):
        lucid_assign.pad_targets(rows, 1)
    bad = rows.clone()
    bad[1, 0] = 0.5
    with pytest.raises(ValueError, match=r"targets\[1, 0\] must be an image index"):
        lucid_assign.pad_targets(bad, 2)
    with pytest.raises(ValueError, match=r"targets has 3 rows for image 1, more than max_objects \(2\)"):
        lucid_assign.pad_targets(rows, 2, max_objects=2)


def test_pad_targets_unchecked_leaves_out_what_does_not_fit():
    """check=False never reads the rows: rows of no image, or past max_objects, are left out, never written
    elsewhere."""
    rows = _flat(2, [2, 3], 4, shuffle=False)
    rows[0, 0] = 5.0  # no such image
    labels, boxes, mask = lucid_assign.pad_targets(rows, 2, max_objects=2, check=False)
    assert mask[:, :, 0].tolist() == [[True, False], [True, True]]
    assert torch.equal(boxes[0, 0], rows[1, 2:]) and torch.equal(boxes[1], rows[2:4, 2:])


def test_pad_targets_feeds_the_op_as_the_peers_padding_does():
    """The assignment from pad_targets' inputs equals the assignment from a loop's padding."""
    rows = _flat(3, [4, 0, 6], 5, seed=2)
    rows[:, 1] %= 3
    rows[:, 6] = rows[:, 6] / 100
    from lucid_assign.synthetic import dota_like_batch
    b = dota_like_batch(batch=3, img_size=128, num_classes=3, objects=(1, 2), seed=1)
    common = (b["pd_scores"], b["pd_bboxes"], b["anc_points"])
    settings = dict(topk=10, num_classes=3, alpha=0.5, beta=6.0, stride=[8, 16, 32])
    got = lucid_assign.assign(*common, *lucid_assign.pad_targets(rows, 3), **settings)
    want = lucid_assign.assign(*common, *_padded_by_loop(rows, 3), **settings)
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert int(got[3].sum()) > 0


def _example():
    spec = importlib.util.spec_from_file_location("train_obb", os.path.join(ROOT, "examples", "train_obb.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("device", DEVICES)
def test_the_example_trains_and_its_loss_falls(library, device):
    """examples/train_obb.py on the op: the mean loss of the last 10 of 60 steps is below that of the first 10."""
    losses = _example().train(steps=60, batch=8, device=device, verbose=False)
    assert len(losses) == 60 and all(torch.isfinite(torch.tensor(losses)))
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    assert last < first, (first, last)


def test_the_example_runs_as_a_script(library, capsys):
    _example().main(["--device", "cpu", "--steps", "3", "--batch", "2"])
    out = capsys.readouterr().out
    assert "3 steps on cpu" in out and "step    0  loss" in out

