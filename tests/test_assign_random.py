"""Randomised configurations of the whole assignment against the reference: image sizes with few anchors (so top-k
comes close to A), top-k and top-k2 drawn at random, duplicate objects (conflict ties go to the lower row), a box
larger than the image (every anchor a candidate), odd alpha/beta, all score dtypes."""

import random

import pytest
import torch

from lucid_assign import ops, reference

from cases import STRIDES, make_problem, to
from conftest import devices
from contract import assert_matches


def _case(i):
    rng = random.Random(i)
    obb = rng.random() < 0.5
    img = rng.choice([32, 64, 128])
    n_boxes = rng.randint(1, 25)
    n_anchors = sum((img // s) ** 2 for s in STRIDES)
    inputs = list(make_problem(1000 + i, obb, batch=rng.randint(1, 3), n_boxes=n_boxes, img_size=img,
                               pad_rows=rng.randint(0, n_boxes), score_dtype=rng.choice(
                                   [torch.float32, torch.bfloat16, torch.float16]),
                               tiny_frac=rng.random(), edge_frac=rng.random(), cluster=rng.random() < 0.7))
    if rng.random() < 0.3:  # a duplicate of row 0
        inputs[4][:, -1], inputs[3][:, -1] = inputs[4][:, 0], inputs[3][:, 0]
    if rng.random() < 0.3:  # row 0 covers the whole image
        inputs[4][:, 0] = (torch.tensor([img / 2, img / 2, img * 2.0, img * 2.0, 0.1]) if obb
                           else torch.tensor([-5.0, -5.0, img + 5.0, img + 5.0]))
    kw = dict(topk=rng.randint(1, min(n_anchors, 40)), topk2=rng.choice([None, rng.randint(1, min(n_anchors, 40))]),
              num_classes=7, alpha=rng.choice([0.5, 1.0, 2.0, 0.7]), beta=rng.choice([6.0, 1.0, 2.0]))
    return inputs, kw


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("chunk", range(4))
def test_random_configurations(library, device, chunk):
    for i in range(chunk * 15, chunk * 15 + 15):
        inputs, kw = _case(i)
        inputs = to(device, inputs)
        want = reference.assign(*inputs, stride=STRIDES, **kw)
        got = ops.assign(*inputs, stride_val=reference.stride_value(STRIDES), **kw)
        assert_matches(got, want, device == "cuda", f"case {i} {kw}")
