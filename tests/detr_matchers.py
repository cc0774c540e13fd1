"""DETR-style matchers written here in the pattern many DETR repositories share (lucid_assign/integrations/detr.py):
the cost of every (query, object) pair of the batch on the device, copied to the host, split by the images' object
counts, each image's block to SciPy. The tests patch them (directly, by class or by name, and through
``lucid-assign run``) and compare every call with the same matcher unpatched.

``batch(...)`` makes a batch of decoder outputs and targets; ``tests/detr_run.py`` runs the matchers in a process
started under ``lucid-assign run``."""

from __future__ import annotations

import contextlib

import numpy as np
import scipy.optimize
import torch
from scipy.optimize import linear_sum_assignment
from torch import nn


def _corners(b: torch.Tensor) -> torch.Tensor:
    cx, cy, w, h = b.unbind(-1)
    return torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], -1)


def _giou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Generalised IoU of corner boxes a (N, 4) against b (M, 4): (N, M)."""
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    lt, rb = torch.max(a[:, None, :2], b[:, :2]), torch.min(a[:, None, 2:], b[:, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    union = area_a[:, None] + area_b - inter
    hull = (torch.max(a[:, None, 2:], b[:, 2:]) - torch.min(a[:, None, :2], b[:, :2])).clamp(min=0).prod(-1)
    return inter / union - (hull - union) / hull


class SoftmaxMatcher(nn.Module):
    """DETR's kind: minus the softmax probability of each object's class, the boxes' L1 and minus their GIoU."""

    def __init__(self, cost_class: float = 1.0, cost_bbox: float = 5.0, cost_giou: float = 2.0, forbid: float = 0.0):
        super().__init__()
        self.cost_class, self.cost_bbox, self.cost_giou = cost_class, cost_bbox, cost_giou
        self.forbid = forbid  # this share of the pairs at +inf (forbidden), drawn from a fixed seed

    def class_cost(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return -logits.softmax(-1)[:, labels]

    def cost(self, outputs: dict, targets: list) -> torch.Tensor:
        bs, nq = outputs["pred_logits"].shape[:2]
        logits = outputs["pred_logits"].flatten(0, 1)
        boxes = outputs["pred_boxes"].flatten(0, 1)
        labels = torch.cat([t["labels"] for t in targets])
        objects = torch.cat([t["boxes"] for t in targets])
        c = (self.cost_bbox * torch.cdist(boxes, objects, p=1) + self.cost_class * self.class_cost(logits, labels)
             - self.cost_giou * _giou(_corners(boxes), _corners(objects)))
        if self.forbid:
            drawn = torch.rand(c.shape, generator=torch.Generator().manual_seed(1)) < self.forbid
            c = c.masked_fill(drawn.to(c.device), float("inf"))
        return c.view(bs, nq, -1)

    @torch.no_grad()
    def forward(self, outputs: dict, targets: list):
        c = self.cost(outputs, targets).cpu()
        sizes = [len(t["boxes"]) for t in targets]
        indices = [linear_sum_assignment(block[i]) for i, block in enumerate(c.split(sizes, -1))]
        return [(torch.as_tensor(i, dtype=torch.int64), torch.as_tensor(j, dtype=torch.int64)) for i, j in indices]


class FocalMatcher(SoftmaxMatcher):
    """Deformable DETR's and RT-DETR's kind: the focal cost of each object's class; its forward inherited."""

    def class_cost(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        p = logits.sigmoid()[:, labels]
        neg = 0.75 * p ** 2 * -(1 - p + 1e-8).log()
        pos = 0.25 * (1 - p) ** 2 * -(p + 1e-8).log()
        return pos - neg


class OneToManyMatcher(SoftmaxMatcher):
    """Matches ``k`` rounds: after each, the queries matched are masked in the host copy (in place) and the images
    solved again; returns the rounds' matches."""

    def __init__(self, k: int = 3, **kw):
        super().__init__(**kw)
        self.k = k

    @torch.no_grad()
    def forward(self, outputs: dict, targets: list):
        c = self.cost(outputs, targets).cpu()
        sizes = [len(t["boxes"]) for t in targets]
        rounds = []
        for _ in range(self.k):
            found = [linear_sum_assignment(block[i]) for i, block in enumerate(c.split(sizes, -1))]
            found = [(torch.as_tensor(i, dtype=torch.int64), torch.as_tensor(j, dtype=torch.int64)) for i, j in found]
            for block, (rows, _) in zip(c.split(sizes, -1), found):
                block[:, rows] = 1e6
            rounds.append(found)
        return rounds


class GroupedMatcher(SoftmaxMatcher):
    """The queries in ``groups`` groups, each matched alone (group DETR): the groups' matches, the queries offset."""

    def __init__(self, groups: int = 3, **kw):
        super().__init__(**kw)
        self.groups = groups

    @torch.no_grad()
    def forward(self, outputs: dict, targets: list):
        c = self.cost(outputs, targets).cpu()
        sizes = [len(t["boxes"]) for t in targets]
        per = c.shape[1] // self.groups
        found = [[] for _ in sizes]
        for g in range(self.groups):
            for i, block in enumerate(c[:, g * per:(g + 1) * per].split(sizes, -1)):
                rows, cols = linear_sum_assignment(block[i])
                found[i].append((rows + g * per, cols))
        return [(torch.as_tensor(np.concatenate([r for r, _ in f]), dtype=torch.int64),
                 torch.as_tensor(np.concatenate([c for _, c in f]), dtype=torch.int64)) for f in found]


class PerImageMatcher(SoftmaxMatcher):
    """Copies each image's block to the host on its own (no split), and asks SciPy to maximise minus the cost."""

    @torch.no_grad()
    def forward(self, outputs: dict, targets: list):
        c = self.cost(outputs, targets)
        sizes = [len(t["boxes"]) for t in targets]
        out, start = [], 0
        for i, n in enumerate(sizes):
            rows, cols = linear_sum_assignment((-c[i, :, start:start + n]).cpu(), maximize=True)
            out.append((torch.as_tensor(rows, dtype=torch.int64), torch.as_tensor(cols, dtype=torch.int64)))
            start += n
        return out


class NumpyMatcher(SoftmaxMatcher):
    """Hands SciPy NumPy arrays (not recognised: SciPy itself, said once)."""

    @torch.no_grad()
    def forward(self, outputs: dict, targets: list):
        c = self.cost(outputs, targets).cpu()
        sizes = [len(t["boxes"]) for t in targets]
        indices = [linear_sum_assignment(block[i].numpy()) for i, block in enumerate(c.split(sizes, -1))]
        return [(torch.as_tensor(i, dtype=torch.int64), torch.as_tensor(j, dtype=torch.int64)) for i, j in indices]


class ModuleAttributeMatcher(SoftmaxMatcher):
    """Calls SciPy through its module (``scipy.optimize.linear_sum_assignment``): no name of its module is SciPy's
    function, so the patch leaves it as it is, said once."""

    @torch.no_grad()
    def forward(self, outputs: dict, targets: list):
        c = self.cost(outputs, targets).cpu()
        sizes = [len(t["boxes"]) for t in targets]
        indices = [scipy.optimize.linear_sum_assignment(block[i]) for i, block in enumerate(c.split(sizes, -1))]
        return [(torch.as_tensor(i, dtype=torch.int64), torch.as_tensor(j, dtype=torch.int64)) for i, j in indices]


@contextlib.contextmanager
def counting():
    """The op's solves (lucid_assign.matching.run) and SciPy's (lucid_assign.integrations.detr._scipy) in the block,
    counted in the dict it yields."""
    from lucid_assign import matching
    from lucid_assign.integrations import detr

    counts = {"op": 0, "scipy": 0}
    run, scipy = matching.run, detr._scipy

    def counted(key, fn):
        def call(*args, **kwargs):
            counts[key] += 1
            return fn(*args, **kwargs)
        return call

    matching.run, detr._scipy = counted("op", run), counted("scipy", scipy)
    try:
        yield counts
    finally:
        matching.run, detr._scipy = run, scipy


MATCHERS = {"softmax": SoftmaxMatcher, "focal": FocalMatcher, "one-to-many": OneToManyMatcher,
            "grouped": GroupedMatcher, "per-image": PerImageMatcher}


def batch(counts, queries: int = 12, classes: int = 5, device="cpu", seed: int = 0, dtype=torch.float32,
          ties: bool = False, bad: str | None = None):
    """Decoder outputs and targets: ``counts[b]`` objects in image b. ``ties``: every query predicts alike (costs
    tied everywhere); ``bad``: "nan" in image 0's first object's box (a cost SciPy refuses)."""
    g = torch.Generator().manual_seed(seed)
    bs = len(counts)
    logits = torch.randn(bs, queries, classes, generator=g, dtype=dtype)
    boxes = torch.rand(bs, queries, 4, generator=g, dtype=dtype) * 0.5 + 0.25
    if ties:
        logits[:] = logits[:, :1]
        boxes[:] = boxes[:, :1]
    targets = []
    for n in counts:
        t = {"labels": torch.randint(0, classes, (n,), generator=g),
             "boxes": torch.rand(n, 4, generator=g, dtype=dtype) * 0.5 + 0.25}
        targets.append(t)
    if bad and counts[0]:
        targets[0]["boxes"][0, 0] = float(bad)
    move = {k: v.to(device) for k, v in dict(pred_logits=logits, pred_boxes=boxes).items()}
    return move, [{k: v.to(device) for k, v in t.items()} for t in targets]
