"""The peer's (ultralytics) RT-DETR matcher on lucid-assign's batched linear sum assignment.

The peer's ``HungarianMatcher`` (built by ``DETRLoss`` and ``RTDETRDetectionLoss``) computes a (batch, queries,
objects) cost on the device, copies it to the host and calls ``linear_sum_assignment`` once per image, seven times a
step. ``LucidHungarianMatcher`` computes the same cost with the same tensor operations, matches every image in one
call of ``torch.ops.lucid.linear_sum_assignment`` on the cost's device (SciPy's choice, ties included) and returns
what the peer's loss expects: per image, the matched queries in ascending order and their objects' indices into the
batch's concatenated objects (index tensors on the cost's device, where the peer's are on the CPU). The loss calls it
once per layer of the decoder's stacked outputs: the first call of a stack matches all its layers at once
(_matching.layered). This file holds only what is the peer's: its cost, the check of the installed release, and the
matcher class; the matching core (_matching.py) does the rest.

Its releases compute the cost in one of a few ways, told apart by ``Variant``:
- layout: "flat" (8.0 to 8.3.1xx: every query against every object of the batch, each image's block taken from it)
  or "padded" (later: each image's objects padded to the batch's largest count);
- widen: the scores and boxes taken to float32 first (8.4.180 on);
- sanitize: NaN and infinite costs set to 0 (8.0.200 on; before, SciPy refused them).
patch() picks the variant that gives the installed release's matches on built-in batches (check_matcher), never by
the version string, and leaves the matcher to the peer when none does, or when the peer would not run SciPy.
"""

from __future__ import annotations

import itertools
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F

from .. import _library, ops
from . import _matching as core
from ._matching import Layout, layout
from ._patching import ULTRALYTICS as STATE
from ._peer import first_module

# Where the peer keeps the matcher (ops) and the losses that build it (loss), 8.0.1xx's vit package first.
_MATCHER_MODULES = ("ultralytics.models.utils.ops", "ultralytics.vit.utils.ops")
_DETR_LOSS_MODULES = ("ultralytics.models.utils.loss", "ultralytics.vit.utils.loss")
NAME = "HungarianMatcher"


class Variant(NamedTuple):
    layout: str  # "padded" or "flat"
    widen: bool
    sanitize: bool


class Pending(NamedTuple):
    """LucidHungarianMatcher.variant from patch() until the installed release's check has run: ``settle``, the
    check, which the first matcher built runs (it sets the variant)."""
    settle: Callable[[], None]


VARIANTS = tuple(Variant(*v) for v in itertools.product(("padded", "flat"), (True, False), (True, False)))


def matcher_modules() -> list:
    """The peer's modules that hold the name HungarianMatcher: the matcher's own and the losses'."""
    found = []
    for names in (_MATCHER_MODULES, _DETR_LOSS_MODULES):
        try:
            module = first_module(names)
        except Exception:  # an RT-DETR module that fails to import (e.g. without SciPy before 8.4): nothing to patch
            module = None
        if module is not None and isinstance(getattr(module, NAME, None), type):
            found.append(module)
    return found


def peer_solver_is_scipy() -> bool:
    """Whether the peer's matcher solves with SciPy (it does whenever SciPy imports; 8.4.x falls back to its own
    NumPy solver without it, which may break ties differently)."""
    try:
        import scipy.optimize  # noqa: F401
    except ImportError:
        return False
    return True


def _focal_class_cost(p: torch.Tensor, alpha: float, gamma: float) -> torch.Tensor:
    """The focal classification cost of probabilities p, the peer's operations in its order."""
    neg = (1 - alpha) * (p**gamma) * (-(1 - p + 1e-8).log())
    pos = alpha * ((1 - p) ** gamma) * (-(p + 1e-8).log())
    return pos - neg


def matching_cost(m, variant: Variant, bbox_iou, pred_bboxes, pred_scores, gt_bboxes, gt_cls, groups,
                  where: Layout | None = None):
    """The peer's cost of matcher ``m`` (its cost_gain, use_fl, alpha, gamma) under ``variant``, with the peer's own
    ``bbox_iou``: (bs, nq, max(groups)), each image's objects in its first columns."""
    bs, nq, nc = pred_scores.shape
    where = where or layout(groups, nq, 1, pred_scores.device)
    scores, boxes = pred_scores.detach(), pred_bboxes.detach()
    if variant.widen:
        scores, boxes = scores.float(), boxes.float()
    if variant.layout == "padded":
        gt_boxes, gt_labels = core.pad_objects(gt_bboxes, where), core.pad_objects(gt_cls, where)
        probs = scores.sigmoid() if m.use_fl else F.softmax(scores, dim=-1)
        probs = probs.gather(2, gt_labels[:, None].expand(-1, nq, -1))
        pd, gt = boxes.unsqueeze(2), gt_boxes.unsqueeze(1)
    else:
        probs = scores.view(-1, nc)
        probs = probs.sigmoid() if m.use_fl else F.softmax(probs, dim=-1)
        probs = probs[:, gt_cls]
        pd, gt = boxes.view(-1, 4).unsqueeze(1), gt_bboxes.unsqueeze(0)
    cost_class = _focal_class_cost(probs, m.alpha, m.gamma) if m.use_fl else -probs
    cost_bbox = (pd - gt).abs().sum(-1)
    cost_giou = 1.0 - bbox_iou(pd, gt, xywh=True, GIoU=True).squeeze(-1)
    gain = m.cost_gain
    cost = gain["class"] * cost_class + gain["bbox"] * cost_bbox + gain["giou"] * cost_giou
    if variant.sanitize:  # the peer's masked assignment, as a fill that does not wait for the device (same values)
        cost = cost.masked_fill(cost.isnan() | cost.isinf(), 0.0)
    if variant.layout == "padded":
        return cost
    # each image's block of the batch-wide cost, its objects in the first columns (exact: a gather)
    cost = cost.view(bs, nq, -1)
    return cost.gather(2, where.columns[:, None, :].expand(bs, nq, where.width))


def match(cost: torch.Tensor, groups: list, backend: str, check: bool, where: Layout | None = None) -> list:
    """Each image's matches of the padded cost, as the peer's matcher returns them: (queries ascending, objects'
    indices into the batch's concatenated objects)."""
    where = where or layout(groups, cost.shape[1], 1, cost.device)
    return core.solve_call(cost, where, backend, check, batch_objects=True)


class LucidHungarianMatcher(torch.nn.Module):
    """The peer's ``HungarianMatcher`` while patched: the peer's constructor and settings, the peer's cost, SciPy's
    matches from lucid-assign's batched op on the cost's device. Calls it does not reproduce (the mask cost of early
    releases) go to the peer's own matcher, which it keeps. A matcher keeps the cost variant and backend that patch()
    had set when it was built, as the patched assigners keep their rule sets: one built while patched stays
    lucid-assign's after unpatch()."""

    variant: Variant | None = None  # found for the installed release while patched; each instance takes it when built
    backend = "auto"

    def __init__(self, *args, **kwargs):
        super().__init__()
        if isinstance(type(self).variant, Pending):  # the first one built while patched: the release's check
            type(self).variant.settle()
        self.__dict__.update(variant=type(self).variant, backend=type(self).backend)
        peer = _peer_matcher_class()(*args, **kwargs)
        self.__dict__.update({k: v for k, v in vars(peer).items() if not k.startswith("_") and k != "training"})
        self.__dict__["_peer_matcher"] = peer  # not a submodule: a fallback, not part of the model
        self.__dict__["_peer_args"] = (args, kwargs)

    # Pickled (the trainers of early releases save the model with its loss) without the peer's matcher, whose class
    # pickle cannot name while patched (the name is this class's); it is built again from the same arguments.
    def __getstate__(self):
        state = dict(super().__getstate__() if hasattr(super(), "__getstate__") else self.__dict__)
        state.pop("_peer_matcher", None)
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        args, kwargs = self._peer_args
        self.__dict__["_peer_matcher"] = _peer_matcher_class()(*args, **kwargs)

    def forward(self, pred_bboxes, pred_scores, gt_bboxes, gt_cls, gt_groups, masks=None, gt_mask=None):
        variant = self.variant
        uses_masks = getattr(self, "with_mask", False) or masks is not None or gt_mask is not None
        backend = None
        if variant is not None and not uses_masks:
            backend = core.runs_here(STATE, self.backend, pred_scores.device.type, NAME)
        if backend is None:
            extra = {} if masks is None and gt_mask is None else dict(masks=masks, gt_mask=gt_mask)
            return self._peer_matcher(pred_bboxes, pred_scores, gt_bboxes, gt_cls, gt_groups, **extra)
        if self.__dict__.get("_first_call", True):
            self.__dict__["_first_call"] = False
            what = f"{NAME} ran lucid-assign's {backend} on {pred_scores.device}"
            STATE.verbose(what)
            STATE.announce(what, _version())
        groups = [int(n) for n in gt_groups]
        if sum(groups) == 0:  # the peer's own answer: empty CPU index tensors
            return [(torch.tensor([], dtype=torch.long), torch.tensor([], dtype=torch.long)) for _ in groups]
        check = not variant.sanitize  # without sanitising, the peer's SciPy refuses NaN and infinite costs: so do we
        with torch.no_grad():
            where = layout(groups, pred_scores.shape[1], 1, pred_scores.device)

            def costs(stacks):  # each layer's (B, Q, most objects) cost of (L, B, Q, .) stacks, or one call's
                order = _fused_order(self, variant, pred_bboxes, pred_scores, gt_bboxes, gt_cls, groups, backend)
                return self.cost(*stacks, gt_bboxes, gt_cls, where, order)

            found = core.layered(self, (pred_bboxes, pred_scores), (gt_bboxes, gt_cls), where, costs, backend, check,
                                 batch_objects=True)
            if found is not None:
                return found
            return core.solve_call(costs([pred_bboxes, pred_scores]), where, backend, check, batch_objects=True)

    def cost(self, pred_bboxes, pred_scores, gt_bboxes, gt_cls, where: Layout, order: int | None):
        """The peer's cost of one call's (B, Q, .) predictions, (B, Q, most objects), or of each layer of (L, B, Q, .)
        stacks, (L * B, Q, most objects): in one pass (ops.detr_cost, with the L1 in ``order``) where the check on the
        device allowed it (_fused_order), else with the peer's operations on each layer (matching_cost)."""
        stacked = pred_scores.dim() == 4
        if order is None:
            bbox_iou, groups = _peer_bbox_iou(), list(where.counts)
            if not stacked:
                return matching_cost(self, self.variant, bbox_iou, pred_bboxes, pred_scores, gt_bboxes, gt_cls, groups,
                                     where)
            return torch.cat([matching_cost(self, self.variant, bbox_iou, b, s, gt_bboxes, gt_cls, groups, where)
                              for b, s in zip(pred_bboxes, pred_scores)])
        sizes = where.sizes
        if stacked:  # the L * B images, the objects repeated for each layer (the op takes image b's after b - 1's)
            layers, bs, nq = pred_scores.shape[:3]
            pred_bboxes = pred_bboxes.reshape(layers * bs, nq, pred_bboxes.shape[-1])
            pred_scores = pred_scores.reshape(layers * bs, nq, pred_scores.shape[-1])
            gt_bboxes, gt_cls, sizes = gt_bboxes.repeat(layers, 1), gt_cls.repeat(layers), sizes.repeat(layers)
        gain = self.cost_gain
        return ops.detr_cost(pred_bboxes.detach(), pred_scores.detach(), gt_bboxes, gt_cls, sizes, where.width,
                             (gain["class"], gain["bbox"], gain["giou"]), self.alpha, self.gamma,
                             sanitize=self.variant.sanitize, l1_order=order)


# --- the cost in one pass (torch.ops.lucid.detr_cost) ------------------------------------------------------------
# The op computes the peer's chain of float32 operations in one kernel (csrc/detr_cost.h). It is used on CUDA only,
# where PyTorch's elementwise kernels and the op use the same math library, and only after a check on the device:
# the first call with given settings computes a built-in batch both ways and keeps the op if its cost equals the
# peer's operations' element for element with one of the L1's two summation orders (one synchronisation, once per
# device and settings); otherwise the matcher keeps the peer's operations.
_FUSED: dict = {}


def _fused_batch(device):
    """A built-in batch for the check: wide logits (saturated sigmoids), boxes that overlap, nest, touch and miss,
    zero-sized boxes, duplicated objects, an image without objects, and a NaN."""
    g = torch.Generator().manual_seed(1)
    bs, nq, nc, groups = 4, 96, 7, [0, 9, 31, 96]
    total = sum(groups)
    pred = torch.rand(bs, nq, 4, generator=g) * 0.8 + 0.1
    pred[..., 2:] *= torch.rand(bs, nq, 1, generator=g) ** 2
    pred[0, :4, 2:] = 0.0
    gt = torch.rand(total, 4, generator=g) * 0.8 + 0.1
    gt[3] = gt[2]
    gt[7, 2:] = 0.0
    gt[10:20] = pred[2, 10:20]
    logits = torch.randn(bs, nq, nc, generator=g) * 6
    logits[1, :5] = torch.tensor([30.0, -30.0, 90.0, -90.0, 0.0])[:, None]
    pred[3, 7, 1] = float("nan")
    cls = torch.randint(0, nc, (total,), generator=g)
    return [t.to(device) for t in (pred, logits, gt, cls)] + [groups]


def _fused_order(m, variant: Variant, pred_bboxes, pred_scores, gt_bboxes, gt_cls, groups, backend) -> int | None:
    """The L1 summation order with which ops.detr_cost gives matcher m's cost under variant on this call's device, or
    None when the call keeps the peer's operations (the kernel backend only: "kernel" and "auto" alike)."""
    device = pred_scores.device
    float32 = (torch.float32,)
    narrow = (torch.float32, torch.bfloat16, torch.float16)
    eligible = (device.type == "cuda" and backend == "kernel" and m.use_fl and _library.has_kernel("detr_cost", "cuda")
                and gt_bboxes.dtype in narrow and gt_bboxes.device == device and gt_cls.device == device
                and tuple(gt_bboxes.shape) == (sum(groups), 4) and tuple(gt_cls.shape) == (sum(groups),)
                and pred_bboxes.shape[-1] == 4
                and (variant.widen or (pred_scores.dtype in float32 and pred_bboxes.dtype in float32)))
    if not eligible:
        return None
    gain = m.cost_gain
    key = (str(device), variant, float(m.alpha), float(m.gamma), float(gain["class"]), float(gain["bbox"]),
           float(gain["giou"]))
    if key not in _FUSED:
        _FUSED[key] = _check_fused(m, variant, device)
    return _FUSED[key]


def _check_fused(m, variant: Variant, device) -> int | None:
    pred, logits, gt, cls, groups = _fused_batch(device)
    where = layout(groups, pred.shape[1], 1, device)
    gain = m.cost_gain
    want = matching_cost(m, variant, _peer_bbox_iou(), pred, logits, gt, cls, groups, where)
    for order in (1, 0):
        got = ops.detr_cost(pred, logits, gt, cls, where.sizes, where.width,
                            (gain["class"], gain["bbox"], gain["giou"]), m.alpha, m.gamma, sanitize=variant.sanitize,
                            l1_order=order)
        if _same_costs(got, want, groups, "padded"):
            return order
    return None


def _peer_matcher_class():
    return STATE.original(NAME) or getattr(matcher_modules()[0], NAME)


def _version() -> str:
    from .. import __version__

    return __version__


def _peer_bbox_iou():
    return first_module(("ultralytics.utils.metrics", "ultralytics.yolo.utils.metrics")).bbox_iou


# --- patch()'s check --------------------------------------------------------------------------------------------


def _check_batches():
    """Built-in matcher inputs: (pred_bboxes, pred_scores, gt_bboxes, gt_cls, gt_groups) with an image without
    objects, duplicated objects (exact ties that only SciPy's tie rules settle), a float32 batch, a bfloat16 one (what
    autocast gives the loss; it tells the releases that widen first), and one whose predictions hold a NaN (it tells
    the releases that sanitise)."""
    g = torch.Generator().manual_seed(0)
    bs, nq, nc, groups = 3, 12, 6, [4, 0, 7]
    total = sum(groups)
    gt_boxes = torch.rand(total, 4, generator=g) * 0.5 + 0.2
    gt_boxes[1] = gt_boxes[0]  # a duplicated object: its two columns tie
    gt_boxes[5] = gt_boxes[6]
    gt_cls = torch.randint(0, nc, (total,), generator=g)
    gt_cls[1], gt_cls[5] = gt_cls[0], gt_cls[6]
    pred_boxes = torch.rand(bs, nq, 4, generator=g) * 0.5 + 0.2
    pred_boxes[0, 3] = pred_boxes[0, 2]  # duplicated queries: their rows tie
    logits = torch.randn(bs, nq, nc, generator=g) * 3
    yield pred_boxes, logits, gt_boxes, gt_cls, groups
    yield pred_boxes.bfloat16(), logits.bfloat16(), gt_boxes, gt_cls, groups
    nan_boxes = pred_boxes.clone()
    nan_boxes[2, 5, 1] = float("nan")
    yield nan_boxes, logits, gt_boxes, gt_cls, groups


def _outcome(call):
    try:
        return [(i.tolist(), j.tolist()) for i, j in call()]
    except ValueError:  # SciPy's refusal of NaN (in its words; ours name the image)
        return "ValueError"


def _image_blocks(cost: torch.Tensor, groups: list, layout: str) -> list:
    """Each image's (queries, objects) block of a cost as ``layout`` holds it."""
    starts = list(itertools.accumulate(groups, initial=0))
    if layout == "flat":
        return [cost[b, :, starts[b]:starts[b] + n] for b, n in enumerate(groups)]
    return [cost[b, :, :n] for b, n in enumerate(groups)]


def _same_costs(ours: torch.Tensor, theirs: torch.Tensor, groups: list, layout: str) -> bool:
    if theirs.dtype != ours.dtype:
        return False
    return all(torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))
               for a, b in zip(_image_blocks(ours, groups, "padded"), _image_blocks(theirs, groups, layout)))


def check_matcher(peer_cls) -> tuple:
    """(the variant whose costs, element by element, and matches equal those of the peer's ``peer_cls`` on every
    built-in batch, or None; why not). Runs on the CPU, with the reference solver and the peer's own."""
    if not peer_solver_is_scipy():
        return None, ("without SciPy ultralytics matches with its own NumPy solver, which may break exact ties "
                      "differently from SciPy; pip install scipy, and the patch reproduces ultralytics' SciPy matches")
    settings = [dict(cost_gain={"class": 2, "bbox": 5, "giou": 2}),
                dict(cost_gain={"class": 1, "bbox": 5, "giou": 2}, use_fl=False)]
    bbox_iou = _peer_bbox_iou()
    candidates = list(VARIANTS)
    for kw in settings:
        peer = peer_cls(**kw)
        for batch in _check_batches():
            groups = list(batch[4])
            with core.cost_at_cpu(stop=False) as seen:
                theirs = _outcome(lambda: peer(*batch))
            if not seen:
                return None, "its matcher copies no cost to the host as the surveyed releases do"

            def same(v):
                cost = matching_cost(peer, v, bbox_iou, *batch[:4], groups)
                if not _same_costs(cost, seen[-1], groups, v.layout):
                    return False
                return _outcome(lambda: match(cost, groups, "reference", check=not v.sanitize)) == theirs

            candidates = [v for v in candidates if same(v)]
            if not candidates:
                return None, "no variant of the cost gives its costs and matches on the built-in batches"
    return candidates[0], None
