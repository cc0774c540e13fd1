"""The peer's (ultralytics) RT-DETR matcher on lucid-assign's batched linear sum assignment.

The peer's ``HungarianMatcher`` (built by ``DETRLoss`` and ``RTDETRDetectionLoss``) computes a (batch, queries,
objects) cost on the device, copies it to the host and calls ``linear_sum_assignment`` once per image, seven times a
step. ``LucidHungarianMatcher`` computes the same cost with the same tensor operations, matches every image in one
call of ``torch.ops.lucid.linear_sum_assignment`` on the cost's device (SciPy's choice, ties included) and returns
what the peer's loss expects: per image, the matched queries in ascending order and their objects' indices into the
batch's concatenated objects (index tensors on the cost's device, where the peer's are on the CPU). The loss calls it
once per layer of the decoder's stacked outputs: the first call of a stack matches all its layers at once
(LayerMatches), where the cost is computed in one pass.

Its releases compute the cost in one of a few ways, told apart by ``Variant``:
- layout: "flat" (8.0 to 8.3.1xx: every query against every object of the batch, each image's block taken from it)
  or "padded" (later: each image's objects padded to the batch's largest count);
- widen: the scores and boxes taken to float32 first (8.4.180 on);
- sanitize: NaN and infinite costs set to 0 (8.0.200 on; before, SciPy refused them).
patch() picks the variant that gives the installed release's matches on built-in batches (check_matcher), never by
the version string, and leaves the matcher to the peer when none does, or when the peer would not run SciPy.
"""

from __future__ import annotations

import functools
import itertools
import weakref
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from .. import _library, api, ops
from ._peer import first_module

# Where the peer keeps the matcher (ops) and the losses that build it (loss), 8.0.1xx's vit package first.
_MATCHER_MODULES = ("ultralytics.models.utils.ops", "ultralytics.vit.utils.ops")
_DETR_LOSS_MODULES = ("ultralytics.models.utils.loss", "ultralytics.vit.utils.loss")
NAME = "HungarianMatcher"


class Variant(NamedTuple):
    layout: str  # "padded" or "flat"
    widen: bool
    sanitize: bool


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


class Layout(NamedTuple):
    """Where each object and each match of one call goes, computed on the host from the objects per image and copied
    to the device in one transfer: the padded position (image, slot) of each object, and for each match of SciPy's
    form its place in the op's (images, K) outputs and its image's first object."""

    image: torch.Tensor
    slot: torch.Tensor
    pair: torch.Tensor
    offset: torch.Tensor
    matches: list  # matches per image: min(queries, objects)
    sizes: torch.Tensor  # objects per image (the op's sizes)


def layout(groups: list, queries: int, device) -> Layout:
    """The Layout of one call with ``groups[b]`` objects in image b and ``queries`` queries. The last few are kept
    (read-only tensors): the seven matcher calls of an RT-DETR step share one, and its transfer."""
    return _layout(tuple(int(g) for g in groups), int(queries), torch.device(device))


@functools.lru_cache(maxsize=8)
def _layout(groups: tuple, queries: int, device: torch.device) -> Layout:
    n = np.asarray(groups, dtype=np.int64)
    images = np.arange(len(groups))
    starts = np.cumsum(n) - n
    image = np.repeat(images, n)
    slot = np.arange(int(n.sum())) - starts[image]
    k = np.minimum(n, queries)
    pair_image = np.repeat(images, k)
    pair_slot = np.arange(int(k.sum())) - (np.cumsum(k) - k)[pair_image]
    width = min(queries, max(groups))
    packed = np.concatenate((image, slot, pair_image * width + pair_slot, starts[pair_image], n))
    parts = torch.from_numpy(packed).to(device, non_blocking=True).split(
        [len(image), len(slot), len(pair_slot), len(pair_slot), len(n)])
    return Layout(*parts[:4], matches=k.tolist(), sizes=parts[4])


def _pad(flat: torch.Tensor, where: Layout, groups: list) -> torch.Tensor:
    """The peer's ``pad_sequence(flat.split(groups), batch_first=True)`` (zeros after each image's objects) as one
    scatter instead of a copy per image: the same tensor."""
    out = flat.new_zeros((len(groups), max(groups), *flat.shape[1:]))
    return out.index_put_((where.image, where.slot), flat)


def matching_cost(m, variant: Variant, bbox_iou, pred_bboxes, pred_scores, gt_bboxes, gt_cls, groups,
                  where: Layout | None = None):
    """The peer's cost of matcher ``m`` (its cost_gain, use_fl, alpha, gamma) under ``variant``, with the peer's own
    ``bbox_iou``: (bs, nq, max(groups)), each image's objects in its first columns."""
    bs, nq, nc = pred_scores.shape
    where = where or layout(groups, nq, pred_scores.device)
    scores, boxes = pred_scores.detach(), pred_bboxes.detach()
    if variant.widen:
        scores, boxes = scores.float(), boxes.float()
    if variant.layout == "padded":
        gt_boxes, gt_labels = _pad(gt_bboxes, where, groups), _pad(gt_cls, where, groups)
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
    starts = list(itertools.accumulate(groups, initial=0))
    width = max(groups)
    last = starts[-1] - 1
    cols = torch.tensor([[min(starts[b] + min(k, max(n - 1, 0)), last) for k in range(width)]
                         for b, n in enumerate(groups)])
    cols = cols.to(cost.device, non_blocking=True)
    return cost.gather(2, cols[:, None, :].expand(bs, nq, width))


def match(cost: torch.Tensor, groups: list, backend: str, check: bool, where: Layout | None = None) -> list:
    """Each image's matches of the padded cost, as the peer's matcher returns them: (queries ascending, objects'
    indices into the batch's concatenated objects)."""
    where = where or layout(groups, cost.shape[1], cost.device)
    if api.resolve_backend(backend) == "reference":
        rows, cols, info = api.lsap.linear_sum_assignment(cost, where.sizes)
    else:
        rows, cols, info = ops.linear_sum_assignment(cost, where.sizes)
    if check:
        api.raise_unsolved(info)
    return _pairs(rows, cols, where)


def _pairs(rows: torch.Tensor, cols: torch.Tensor, where: Layout, layers: int = 1) -> list:
    """Each image's matches from the op's (layers * B, K) outputs, as the peer's matcher returns them: (queries
    ascending, objects' indices into the batch's concatenated objects), image after image, layer after layer."""
    queries = rows.reshape(layers, -1).index_select(1, where.pair)
    objects = cols.reshape(layers, -1).index_select(1, where.pair).add_(where.offset)
    matches = where.matches * layers
    return list(zip(queries.view(-1).split_with_sizes(matches), objects.view(-1).split_with_sizes(matches)))


class LucidHungarianMatcher(torch.nn.Module):
    """The peer's ``HungarianMatcher`` while patched: the peer's constructor and settings, the peer's cost, SciPy's
    matches from lucid-assign's batched op on the cost's device. Calls it does not reproduce (the mask cost of early
    releases) go to the peer's own matcher, which it keeps. A matcher keeps the cost variant and backend that patch()
    had set when it was built, as the patched assigners keep their rule sets: one built while patched stays
    lucid-assign's after unpatch()."""

    variant: Variant | None = None  # set by patch() for the installed release; each instance takes it when built
    backend = "auto"

    def __init__(self, *args, **kwargs):
        super().__init__()
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
        variant, backend = self.variant, api.resolve_backend(self.backend)
        uses_masks = getattr(self, "with_mask", False) or masks is not None or gt_mask is not None
        if variant is None or uses_masks or not self._runs_here(pred_scores, backend):
            extra = {} if masks is None and gt_mask is None else dict(masks=masks, gt_mask=gt_mask)
            return self._peer_matcher(pred_bboxes, pred_scores, gt_bboxes, gt_cls, gt_groups, **extra)
        if self.__dict__.get("_first_call", True):
            self.__dict__["_first_call"] = False
            _note_first_call(f"{NAME} ran lucid-assign's {'kernel' if backend == 'auto' else backend} on "
                             f"{pred_scores.device}")
        groups = [int(n) for n in gt_groups]
        if sum(groups) == 0:  # the peer's own answer: empty CPU index tensors
            return [(torch.tensor([], dtype=torch.long), torch.tensor([], dtype=torch.long)) for _ in groups]
        with torch.no_grad():
            where = layout(groups, pred_scores.shape[1], pred_scores.device)
            # a layer of the decoder's stacked outputs: all its layers matched in one call, this one's taken
            found = self._from_layers(pred_bboxes, pred_scores, gt_bboxes, gt_cls, groups, where, backend)
            if found is not None:
                return found
            cost = self.cost(pred_bboxes, pred_scores, gt_bboxes, gt_cls, groups, where, backend)
            # without sanitising, the peer's SciPy refuses NaN and infinite costs: so do we (one synchronisation)
            return match(cost, groups, backend, check=not variant.sanitize, where=where)

    def _from_layers(self, pred_bboxes, pred_scores, gt_bboxes, gt_cls, groups: list, where: Layout, backend: str):
        """This call's matches from a LayerMatches of every layer of its inputs' stack (made at the stack's first
        call), or None where the call is not one layer of a stack or the cost is not computed in one pass."""
        boxes_of = _layer_of(pred_bboxes)
        scores_of = None if boxes_of is None else _layer_of(pred_scores)
        if scores_of is None or boxes_of[1] != scores_of[1]:
            return None
        (boxes, layer), (scores, _) = boxes_of, scores_of
        if boxes.shape[0] != scores.shape[0]:
            return None
        settings = (backend, float(self.alpha), float(self.gamma), *(float(v) for v in self.cost_gain.values()))
        memo = _STACKS.get(self)
        if memo is None or not memo.serves(boxes, scores, gt_bboxes, gt_cls, groups, settings, layer):
            order = _fused_order(self, self.variant, pred_bboxes, pred_scores, gt_bboxes, gt_cls, groups, backend)
            if order is None:
                return None
            memo = _STACKS[self] = LayerMatches(self, boxes, scores, gt_bboxes, gt_cls, groups, where, order,
                                                settings)
        return memo.take(layer, check=not self.variant.sanitize)

    def cost(self, pred_bboxes, pred_scores, gt_bboxes, gt_cls, groups: list, where: Layout, backend: str = "auto"):
        """The peer's cost of one call, (bs, nq, max(groups)): in one pass (ops.detr_cost) where the check on the
        device allows it (_fused_order), else with the peer's operations (matching_cost)."""
        variant = self.variant
        order = _fused_order(self, variant, pred_bboxes, pred_scores, gt_bboxes, gt_cls, groups, backend)
        if order is None:
            return matching_cost(self, variant, _peer_bbox_iou(), pred_bboxes, pred_scores, gt_bboxes, gt_cls, groups,
                                 where)
        gain = self.cost_gain
        return ops.detr_cost(pred_bboxes.detach(), pred_scores.detach(), gt_bboxes, gt_cls, where.sizes, max(groups),
                               (gain["class"], gain["bbox"], gain["giou"]), self.alpha, self.gamma,
                               sanitize=variant.sanitize, l1_order=order)

    def _runs_here(self, pred_scores, backend: str) -> bool:
        if backend == "reference":
            return True
        device = pred_scores.device.type
        why = api.device_unsupported(device, "linear_sum_assignment")
        if why is not None and backend == "kernel":
            raise RuntimeError(f"backend='kernel' cannot run the matcher: {why}")
        if why is not None:
            from . import ultralytics as integ

            integ._say_once(f"lucid-assign: the patched {NAME} cannot run its kernel here ({why}), so these calls go "
                            f"to ultralytics' own matcher, at its speed. Fix: {api.kernel_fix(device, why)}")
        return why is None


# --- the layers of one loss call matched at once -----------------------------------------------------------------
# The peer's DETR loss calls the matcher once per layer of the decoder's stacked outputs (RT-DETR: (7, B, Q, .), the
# encoder's and six decoder layers), each call on one layer of the stack, one after another. The first call of a stack
# computes the cost of all its layers in one launch and matches their L * B problems in one, so that the solves of
# the layers run side by side on the device; the later calls take their layer's matches. The problems are independent,
# so each layer's matches are those of a call of its own.
MAX_LAYERS = 16
# each matcher's last stack, outside the matcher (which the trainer deep-copies and saves with the model)
_STACKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _layer_of(t: torch.Tensor):
    """(stack, l) when ``t`` is ``stack[l]`` of a stack of at most MAX_LAYERS layers (what indexing the peer's
    (L, B, Q, .) outputs gives), else None."""
    if type(t) is not torch.Tensor:  # a subclass (a fake tensor of a trace, for one): a call of its own
        return None
    stack = t._base
    if stack is None or stack.dim() != t.dim() + 1 or not 1 < stack.shape[0] <= MAX_LAYERS:
        return None
    if stack.shape[1:] != t.shape or stack.stride()[1:] != t.stride() or stack.stride(0) <= 0:
        return None
    if stack.dtype != t.dtype:  # a view as another type of the same size
        return None
    step = stack.stride(0) * stack.element_size()
    offset = t.data_ptr() - stack.data_ptr()
    if offset % step or not 0 <= offset // step < stack.shape[0]:
        return None
    return stack, offset // step


class LayerMatches:
    """Every layer's matches of one stack of predictions against one batch of objects. It keeps weak references to
    its inputs (never the autograd graph alive) and serves a later call only while they are the same tensors,
    unchanged (their version counters), with the same object counts and matcher settings; each layer's matches are
    handed out once."""

    def __init__(self, m, boxes, scores, gt_bboxes, gt_cls, groups: list, where: Layout, order: int, settings: tuple):
        self._refs = [weakref.ref(t) for t in (boxes, scores, gt_bboxes, gt_cls)]
        self._key = (self._versions(boxes, scores, gt_bboxes, gt_cls), tuple(groups), settings)
        layers, bs, nq = boxes.shape[:3]
        gain = m.cost_gain
        # the stack's L * B images, the objects repeated for each layer (the op takes image b's objects after those
        # of images 0 to b - 1)
        sizes = where.sizes.repeat(layers)
        cost = ops.detr_cost(boxes.detach().reshape(layers * bs, nq, boxes.shape[-1]),
                               scores.detach().reshape(layers * bs, nq, scores.shape[-1]),
                               gt_bboxes.repeat(layers, 1), gt_cls.repeat(layers), sizes, max(groups),
                               (gain["class"], gain["bbox"], gain["giou"]), m.alpha, m.gamma,
                               sanitize=m.variant.sanitize, l1_order=order)
        rows, cols, info = ops.linear_sum_assignment(cost, sizes)
        pairs = _pairs(rows, cols, where, layers)
        self._layers = {layer: pairs[layer * bs:(layer + 1) * bs] for layer in range(layers)}
        self._info = info.view(layers, bs)

    @staticmethod
    def _versions(*tensors) -> tuple:
        return tuple((t._version, t.data_ptr()) for t in tensors)

    def serves(self, boxes, scores, gt_bboxes, gt_cls, groups: list, settings: tuple, layer: int) -> bool:
        """Whether the call on ``layer`` of these inputs takes its matches from here (not when they were taken
        already: a second pass over the same stack is matched afresh, all its layers at once again)."""
        inputs = (boxes, scores, gt_bboxes, gt_cls)
        return (layer in self._layers and all(ref() is t for ref, t in zip(self._refs, inputs))
                and self._key == (self._versions(*inputs), tuple(groups), settings))

    def take(self, layer: int, check: bool):
        """Layer ``layer``'s matches, handed out once. ``check``: SciPy's error where the layer's cost held NaN or an
        infinity (one synchronisation), as the layer's own call gives it."""
        found = self._layers.pop(layer)
        if check:
            api.raise_unsolved(self._info[layer])
        return found


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
    """The L1 summation order with which ops.detr_cost gives matcher m's cost under variant on this call's device,
    or None when the call keeps the peer's operations."""
    device = pred_scores.device
    float32 = (torch.float32,)
    narrow = (torch.float32, torch.bfloat16, torch.float16)
    eligible = (device.type == "cuda" and backend == "auto" and m.use_fl and _library.has_kernel("detr_cost", "cuda")
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
    where = layout(groups, pred.shape[1], device)
    gain = m.cost_gain
    want = matching_cost(m, variant, _peer_bbox_iou(), pred, logits, gt, cls, groups, where)
    for order in (1, 0):
        got = ops.detr_cost(pred, logits, gt, cls, where.sizes, max(groups),
                              (gain["class"], gain["bbox"], gain["giou"]), m.alpha, m.gamma,
                              sanitize=variant.sanitize, l1_order=order)
        if _same_costs(got, want, groups, "padded"):
            return order
    return None


def _peer_matcher_class():
    from . import ultralytics as integ

    return integ._peer_class(NAME) or getattr(matcher_modules()[0], NAME)


def _note_first_call(what: str) -> None:
    from . import ultralytics as integ

    integ._verbose(what)
    integ._announce(what)


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


class _CaptureCost(TorchFunctionMode):
    """Keeps what the peer's matcher copies to the host (``Tensor.cpu``): its whole cost, before SciPy sees it. A
    torch function mode is local to the thread that enters it: no other code sees it."""

    def __init__(self):
        super().__init__()
        self.costs = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.cpu:
            self.costs.append(args[0].detach().clone())
        return func(*args, **(kwargs or {}))


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
            with _CaptureCost() as seen:
                theirs = _outcome(lambda: peer(*batch))
            if not seen.costs:
                return None, "its matcher copies no cost to the host as the surveyed releases do"

            def same(v):
                cost = matching_cost(peer, v, bbox_iou, *batch[:4], groups)
                if not _same_costs(cost, seen.costs[-1], groups, v.layout):
                    return False
                return _outcome(lambda: match(cost, groups, "reference", check=not v.sanitize)) == theirs

            candidates = [v for v in candidates if same(v)]
            if not candidates:
                return None, "no variant of the cost gives its costs and matches on the built-in batches"
    return candidates[0], None
