"""transformers' DETR-family matchers on lucid-assign's batched linear sum assignment.

Every detection matcher of ``transformers/loss/`` computes a (batch, queries, all objects of the batch) cost on the
device, copies it to the host (``.view(batch, queries, -1).cpu()``), splits it by the images' object counts and calls
SciPy's ``linear_sum_assignment`` once per image (LW-DETR's and RF-DETR's once per image and query group). patch()
replaces each matcher's ``forward``, which matches every image (and group) in one call of
``torch.ops.lucid.linear_sum_assignment``, SciPy's choice, ties included, on the cost: for the families listed with a
``block`` below, each image's cost block computed here alone, with the family's operations (every decoder layer of a
loss call at once); for the others, and any kind of call whose blocks differ from the family's own cost, the cost the
matcher's own code computes, taken at its copy to the host. It returns what the matcher returns: per image the
matched queries in ascending order and their objects, int64 index tensors, on the cost's device (the matcher's are on
the CPU). The matching core (_matching.py) does the layout, the solve, the layers at once and the index format. patch()
also wraps the losses' forward (LOSSES): while one runs, the first matcher call solves every output the loss will
match (core.loss_call), one solve and one read of the device a loss call.

Each patched class checks itself once, at its first call in a process: it also runs the matcher's own forward on
those inputs (SciPy on the host, one synchronisation) and compares the matches; a class that differs goes back to its
own forward for the rest of the process, said once. patch_report() says what was patched and what was left.

    from lucid_assign.integrations import transformers as lucid_transformers
    lucid_transformers.patch()   # before training; unpatch() restores the classes
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import itertools
import threading
import weakref
from typing import NamedTuple

import torch

from .. import __version__, _library, dispatch, ops
from . import _matching as core
from . import _patching
from ._patching import TRANSFORMERS as STATE


class Matcher(NamedTuple):
    module: str  # where transformers defines it
    sizes_key: str  # the targets' key whose length is an image's object count (the matcher's own)
    grouped: bool  # forward(outputs, targets, group_detr): the queries in group_detr groups, each matched alone
    layered: bool  # its cost reads only outputs["logits"] and outputs["pred_boxes"], and draws no random numbers:
    # the layers of a decoder's stacked outputs can be matched at once (_from_blocks, _from_layers)
    block: str | None = None  # its cost computed per image block here (_family): how its class term is made


# transformers 5.x, transformers/loss/ (docs/usage.md, "transformers")
MATCHERS = {
    "HungarianMatcher": Matcher("transformers.loss.loss_for_object_detection", "boxes", False, True, "softmax"),
    "DeformableDetrHungarianMatcher": Matcher("transformers.loss.loss_deformable_detr", "boxes", False, True,
                                              "focal"),
    "RTDetrHungarianMatcher": Matcher("transformers.loss.loss_rt_detr", "boxes", False, True, "rt-detr"),
    "LwDetrHungarianMatcher": Matcher("transformers.loss.loss_lw_detr", "boxes", True, True, "lw-detr"),
    "RfDetrHungarianMatcher": Matcher("transformers.loss.loss_rf_detr", "masks", True, False),
    "GroundingDinoHungarianMatcher": Matcher("transformers.loss.loss_grounding_dino", "boxes", False, False),
}

# The losses whose forward calls the matchers above on its outputs, the last layer's, each auxiliary output's and the
# encoder's (core.loss_call: the first call solves them all): name -> where transformers 5.x defines it
LOSSES = {
    "ImageLoss": "transformers.loss.loss_for_object_detection",
    "RTDetrLoss": "transformers.loss.loss_rt_detr",
    "LwDetrImageLoss": "transformers.loss.loss_lw_detr",
}

# STATE (_patching.py): originals, class -> its own forward, while patched; report, class name -> what patch() did;
# backend; said once
_verified: dict = {}  # class -> True (checked, same) / False (differs: its own forward from then on); kept for the
# process, across patch() and unpatch()


def _problems(cost: torch.Tensor, where: core.Layout) -> torch.Tensor | None:
    """The op's problems of a matcher's (batch, queries, all objects) cost (core.problems_of_cross_cost), or None
    where it holds none."""
    if cost.shape[0] == 0 or cost.shape[2] == 0:
        return None
    return core.problems_of_cross_cost(cost, where)


def match(cost: torch.Tensor, sizes: list, groups: int = 1, backend: str = "auto", check: bool = False) -> list:
    """The matcher's result from its (batch, queries, all objects) cost: SciPy's matches of each image (and group),
    as (queries ascending, objects of the image) int64 tensors on the cost's device, without synchronising.

    ``check``: raise SciPy's ValueError, with SciPy's words after the image (and group), where a problem's cost holds
    NaN or -inf or admits no complete matching, as the matcher's loop over SciPy would (one synchronisation); for
    matchers whose cost can hold such values (those that do not replace them, see _sanitizes)."""
    where = core.layout(sizes, cost.shape[1], groups, cost.device)
    return core.solve_call(_problems(cost, where), where, backend, check)


def _same(ours: list, theirs: list) -> bool:
    return len(ours) == len(theirs) and all(
        torch.equal(a.cpu(), c.cpu()) and torch.equal(b.cpu(), d.cpu()) for (a, b), (c, d) in zip(ours, theirs))


def _sanitizes(own) -> bool:
    """Whether a matcher's forward replaces NaN and infinite costs before its copy to the host (transformers 5.18 and
    later: ``torch.nan_to_num``), so that SciPy never refuses them; read from its source. Earlier versions pass such
    costs to SciPy, which raises: their patched calls check the op's status (one synchronisation) to raise as well.
    Without its source a matcher is checked."""
    try:
        return "nan_to_num" in inspect.getsource(own)
    except (OSError, TypeError):
        return False


# --- each image's cost block, as the family computes it -------------------------------------------------------------
# The matchers compute the cost of every query of the batch against every object of the batch (B x Q by the batch's
# N objects: a cdist and elementwise terms) and use only each image's block. Here each image's block alone, for every
# decoder layer of a loss call at once: (L, B, Q, the most objects of an image), with the family's operations in its
# order and dtypes. The class term comes from probabilities computed on the family's own (B * Q, C) tensor of each
# layer, the L1 from the same cdist on the blocks (it computes each pair alone), the rest elementwise. An elementwise
# CUDA kernel computes every element with one function, so each entry is the cross product's; on the CPU, ATen's
# sigmoid and pow (but for the exponents below) round an element by where it falls in the tensor, so the sigmoid is
# taken on the family's own shape and RT-DETR's focal pow only for those exponents. Each kind of call (class, device,
# dtypes, autocast, settings) is checked once against the family's own cost, entry by entry (_verify_blocks); a kind
# that differs keeps the cost its matcher computes.
_EXACT_CPU_POW = (0.0, 1.0, 2.0, 3.0, 0.5, -0.5, -1.0, -2.0)  # ATen's CPU pow: the same rounding at every place
_blocks_ok: dict = {}  # kind of call -> True (its cost per block is the family's) / False (it differs)


class _Family(NamedTuple):
    """How a family's cost is made: its class term ("softmax": minus the softmax probability; "focal": the focal
    terms of every class, then the objects' taken; "focal-gathered": the objects' probabilities taken, then the focal
    terms), the focal alpha and gamma, and whether its L1 is taken in float32 (LW-DETR)."""

    class_term: str
    alpha: float = 0.25
    gamma: float = 2.0
    l1_float32: bool = False


def _family(spec: Matcher, m, device: str) -> _Family | None:
    """The family of matcher ``m`` (of ``spec``), or None where its cost is not computed per block here."""
    if spec.block in ("softmax", "focal"):
        return _Family(spec.block)
    if spec.block == "lw-detr":
        return _Family("focal", l1_float32=True)
    if spec.block == "rt-detr":
        if not getattr(m, "use_focal_loss", False):
            return _Family("softmax")
        alpha, gamma = float(m.alpha), float(m.gamma)
        if device == "cpu" and gamma not in _EXACT_CPU_POW:
            return None
        return _Family("focal-gathered", alpha, gamma)
    return None


def _corners(b: torch.Tensor) -> torch.Tensor:
    """transformers' center_to_corners_format."""
    cx, cy, w, h = b.unbind(-1)
    return torch.stack([(cx - 0.5 * w), (cy - 0.5 * h), (cx + 0.5 * w), (cy + 0.5 * h)], dim=-1)


def _upcast(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype in (torch.float32, torch.float64) else t.float()


def _minus_giou(c1: torch.Tensor, c2: torch.Tensor) -> torch.Tensor:
    """Minus transformers' generalized_box_iou of corners c1 (L, B, Q, 4) against c2 (B, W, 4), per image block
    (L, B, Q, W): its operations on each pair, the x and y components apart (they are elementwise apart there too)."""
    a1, a2 = _upcast(c1), _upcast(c2)
    area1 = ((a1[..., 2] - a1[..., 0]) * (a1[..., 3] - a1[..., 1]))[..., None]
    area2 = ((a2[..., 2] - a2[..., 0]) * (a2[..., 3] - a2[..., 1]))[:, None, :]
    p, o = c1[..., None, :], c2[:, None, :, :]  # (L, B, Q, 1, 4), (B, 1, W, 4)
    inter = ((torch.min(p[..., 2], o[..., 2]) - torch.max(p[..., 0], o[..., 0])).clamp(min=0)
             * (torch.min(p[..., 3], o[..., 3]) - torch.max(p[..., 1], o[..., 1])).clamp(min=0))
    union = area1 + area2 - inter
    iou = inter / union
    area = ((torch.max(p[..., 2], o[..., 2]) - torch.min(p[..., 0], o[..., 0])).clamp(min=0)
            * (torch.max(p[..., 3], o[..., 3]) - torch.min(p[..., 1], o[..., 1])).clamp(min=0))
    return -(iou - (area - union) / area)


_focal = ops.focal_terms  # the focal cost's (positive, negative) terms, the families' operations


def _block_cost(m, fam: _Family, logits, boxes, labels, objects, sanitize: bool):
    """The family's cost per image block of (L, B, Q, .) logits and boxes against each image's objects, padded to W
    (labels (B, W), objects (B, W, 4) cx cy w h): (the cost (L, B, Q, W), whether every layer's boxes and the objects
    are valid corners, on the device: the family raises where they are not)."""
    class_cost = _class_terms(fam, logits, labels)
    if fam.l1_float32:
        dtype = boxes.dtype
        boxes, objects = boxes.to(torch.float32), objects.to(torch.float32)
        bbox_cost = torch.cdist(boxes, objects, p=1).to(dtype)
    else:
        bbox_cost = torch.cdist(boxes, objects, p=1)
    c1, c2 = _corners(boxes), _corners(objects)
    valid = torch.cat([(c1[..., 2:] >= c1[..., :2]).flatten(1).all(1), (c2[..., 2:] >= c2[..., :2]).all()[None]])
    cost = m.bbox_cost * bbox_cost + m.class_cost * class_cost + m.giou_cost * _minus_giou(c1, c2)
    if sanitize:
        top = torch.finfo(cost.dtype).max
        cost = torch.nan_to_num(cost, nan=top, posinf=top, neginf=top)
    return cost, valid


# --- the cost in one op (torch.ops.lucid.detr_cost.family) -----------------------------------------------------------
# The op computes each entry's L1, GIoU and weighted sum as the family's operations round them, in the dtypes the
# family's operations give in the call's autocast region (read once per kind of call from those operations on one
# element, _dtype_plan); on CUDA also its class term, whose elementwise math is CUDA's there too. On the CPU, ATen's
# vectorised sigmoid rounds an element by where it falls in its tensor, so the class term stays the family's own
# operations on its own tensors (the op runs them, every layer of a part at a time). The first call of each kind
# still compares the result with the family's cost entry by entry (_verify_blocks). FAMILY_COST_DEVICES: the devices
# whose calls use the op (those a run has checked); FAMILY_PARTS_DEVICES, those whose calls cost every part of a loss
# call (each stack or output of its own, of its own dtypes) in one call of detr_cost.parts, rather than each run of
# parts of one dtype in a call of detr_cost.family.
FAMILY_COST_DEVICES = ("cpu", "cuda")
FAMILY_PARTS_DEVICES = ("cpu", "cuda")
# the devices (a run has checked) whose loss calls hand a part of one layer to the op as its (B, Q, .) outputs
UNSTACKED_DEVICES = ("cpu", "cuda")
_plans: dict = {}  # kind of call -> the op's dtypes (ops.FAMILY_DTYPES -> dtype), or None (not in the op's dtypes)


def _dtype_plan(m, fam: _Family, kind: tuple, logits, boxes, objects) -> dict | None:
    """The dtype of each step of the family's cost in this call's autocast region (ops.FAMILY_DTYPES), read off its
    own operations on one element; None where a step is not float32, bfloat16 or float16, the class term's is not
    that of its powers times its logs, the cost is not float32 or a gain is not a number."""
    if kind in _plans:
        return _plans[kind]
    plan = None
    try:
        with torch.no_grad():
            one = logits.new_zeros((1, 1))
            if fam.class_term == "softmax":
                prob = power = log = cls = one.softmax(-1).dtype
            else:  # the focal terms' operations (CUDA autocast computes pow and log in float32)
                p = one.sigmoid()
                pos, neg = _focal(p, fam.alpha, fam.gamma)
                prob, power, log, cls = p.dtype, (p**fam.gamma).dtype, (p + 1e-8).log().dtype, (pos - neg).dtype
            q, o = boxes.new_zeros((1, 4)), objects.new_zeros((1, 4))
            if fam.l1_float32:
                l1 = torch.cdist(q.float(), o.float(), p=1).to(boxes.dtype).dtype
                pred_corners = gt_corners = torch.float32
            else:
                l1, pred_corners, gt_corners = torch.cdist(q, o, p=1).dtype, boxes.dtype, objects.dtype
        pairs = torch.promote_types(pred_corners, gt_corners)
        found = dict(prob=prob, pow=power, log=log, cls=cls, l1=l1, pred_corners=pred_corners,
                     gt_corners=gt_corners, pairs=pairs, sum=torch.promote_types(l1, cls))
        if (all(d in ops.DTYPE_CODES for d in found.values()) and cls == torch.promote_types(power, log)
                and torch.promote_types(found["sum"], torch.float32) == torch.float32
                and all(isinstance(getattr(m, k, None), (int, float))
                        for k in ("class_cost", "bbox_cost", "giou_cost"))):
            plan = found
    except Exception:  # a region or dtypes in which the family's own operations fail: its own cost then
        plan = None
    _plans[kind] = plan
    return plan


def _class_terms(fam: _Family, logits, labels):
    """The family's class term of each (layer, image, query, object of the image), (L, B, Q, W), with its own
    operations: the probabilities on each layer's own (B * Q, C) tensor."""
    return ops.family_class_terms_reference(logits, labels, fam.class_term, fam.alpha, fam.gamma)


def _op_problems(m, fam: _Family, plans: list, parts: list, labels, objects, where: core.Layout, sanitize: bool):
    """The problems and the corners' check of the op (see above) of the parts' (logits, boxes) stacks, each with its
    dtype plan: every part in one call of detr_cost.parts (FAMILY_PARTS_DEVICES), else the one part in a call of
    detr_cost.family."""
    device = parts[0][0].device.type
    gains = (m.class_cost, m.bbox_cost, m.giou_cost)
    l1_order = 0 if device == "cpu" else 1
    if device in FAMILY_PARTS_DEVICES:
        return ops.detr_family_parts_cost([p[0] for p in parts], [p[1] for p in parts], labels, objects,
                                          where.image_sizes, where.width, where.groups, gains,
                                          class_term=fam.class_term, alpha=fam.alpha, gamma=fam.gamma,
                                          l1_order=l1_order, dtypes=plans, sanitize=sanitize)
    ((logits, boxes),), (plan,) = parts, plans
    class_cost = None
    if device == "cpu":  # the family's operations, every layer in one call (the same operations in C++)
        class_cost = ops.family_class_terms(logits, labels, where.image_sizes, where.width, fam.class_term,
                                            fam.alpha, fam.gamma)
        scores = logits
    elif fam.class_term == "softmax":
        scores = logits.softmax(-1)  # one launch for every layer: a row's softmax is the same in any number of rows
    else:
        scores = logits
    return ops.detr_family_cost(scores, boxes, labels, objects, where.image_sizes, where.width, where.groups, gains,
                                focal=fam.class_term != "softmax", alpha=fam.alpha, gamma=fam.gamma,
                                l1_order=l1_order, dtypes=plan, sanitize=sanitize, class_cost=class_cost)


_last_objects = threading.local()  # .found: (the targets' tensors (weak), their versions, their labels and boxes)


def _objects_of(targets: list) -> tuple:
    """The batch's labels and boxes, image after image (torch.cat of the targets'), kept for the next call while the
    targets' tensors are the same, unchanged: a loss's matcher calls share them."""
    tensors = [t["class_labels"] for t in targets] + [t["boxes"] for t in targets]
    found = getattr(_last_objects, "found", None)
    if (found is not None and len(found[0]) == len(tensors) and all(r() is t for r, t in zip(found[0], tensors))
            and found[1] == tuple(t._version for t in tensors)):
        return found[2]
    pair = (torch.cat(tensors[: len(targets)]), torch.cat(tensors[len(targets):]))
    if any(t.is_inference() for t in tensors):  # no versions to tell a change by
        _last_objects.found = None
    else:
        _last_objects.found = ([weakref.ref(t) for t in tensors], tuple(t._version for t in tensors), pair)
    return pair


def _op_usable(m, fam: _Family, kind: tuple, logits, boxes, objects, where: core.Layout) -> dict | None:
    """The dtype plan with which the op computes a part's cost (FAMILY_COST_DEVICES), or None."""
    if (kind is None or logits.device.type not in FAMILY_COST_DEVICES or logits.shape[-2] % where.groups != 0
            or not _library.has_kernel("detr_cost", logits.device.type)):
        return None
    return _dtype_plan(m, fam, kind, logits, boxes, objects)


def _block_problems(m, fam: _Family, stacks: list, targets: list, where: core.Layout, sanitize: bool,
                    kind: tuple | None = None):
    """The op's problems (L * B * groups, queries per group, W) of (L, B, Q, .) stacks of logits and boxes, Guarded:
    declined where a layer's boxes or the objects are not valid corners (the family's own check, read after the solve;
    each call then runs on its own, and the family raises at that layer's). ``kind``: the call's kind, whose dtype plan
    lets the op compute the cost (FAMILY_COST_DEVICES)."""
    labels, objects = _objects_of(targets)
    plan = _op_usable(m, fam, kind, *stacks, objects, where)
    if plan is not None:
        return core.Guarded(*_op_problems(m, fam, [plan], [stacks], labels, objects, where, sanitize))
    cost, valid = _block_cost(m, fam, *stacks, core.pad_objects(labels, where), core.pad_objects(objects, where),
                              sanitize)
    layers, bs, nq, width = cost.shape
    per_group = nq // where.groups
    return core.Guarded(cost[:, :, : per_group * where.groups].reshape(layers * bs * where.groups, per_group, width),
                        ~valid.all())


def _parts_problems(m, fam: _Family, kinds: list, views: list, targets: list, where: core.Layout, sanitize: bool):
    """core.by_dtypes's result for the parts of a loss call (``views``: each part's (logits, boxes) stacks,
    (L, B, Q, .), or a part of one layer's (B, Q, .) outputs; ``kinds`` their kinds of call, None where not checked as
    equal to the family's: left out) in one call of the op, where the device takes every part at once
    (FAMILY_PARTS_DEVICES) and the op computes each checked part; else None."""
    logits = views[0][0]
    if logits.device.type not in FAMILY_PARTS_DEVICES or kinds[0] is None:
        return None
    labels, objects = _objects_of(targets)
    plans = [None if k is None else _op_usable(m, fam, k, *v, objects, where) for k, v in zip(kinds, views)]
    if any(k is not None and plan is None for k, plan in zip(kinds, plans)):
        return None  # a checked part the op does not compute: each run of one dtype on its own (core.by_dtypes)
    kept = [plan is not None for plan in plans]
    problems = _op_problems(m, fam, [p for p in plans if p is not None], [v for v, k in zip(views, kept) if k],
                            labels, objects, where, sanitize)
    return *problems, kept


def _kind(m, outputs: dict, targets: list) -> tuple:
    """What a per-block cost's equality to the family's may depend on besides the values: the class, the devices,
    the dtypes, the autocast region and the matcher's settings."""
    logits, boxes = outputs["logits"], outputs["pred_boxes"]
    device = logits.device.type
    dtypes = frozenset((k, v.dtype, v.device) for t in targets for k, v in t.items() if isinstance(v, torch.Tensor))
    region, settings = core._region(device), core.settings_of(m)
    return type(m), device, logits.dtype, boxes.dtype, boxes.device.type, dtypes, region, settings


def _same_problems(ours: torch.Tensor, theirs: torch.Tensor, where: core.Layout) -> bool:
    """Bit for bit on every problem's valid columns (NaN where NaN; the sign of zero too)."""
    if ours.shape != theirs.shape or ours.dtype != theirs.dtype:
        return False
    valid = torch.arange(ours.shape[2], device=ours.device)[None, :] < where.sizes[:, None]
    a, b = ours.transpose(1, 2)[valid], theirs.transpose(1, 2)[valid]
    return (torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))
            and torch.equal(a.signbit(), b.signbit()))


def _blocks_usable(spec: Matcher, m, outputs, targets: list, where: core.Layout):
    """(the family, the kind of call) where this call's cost can be computed per block, else (None, None)."""
    if spec.block is None or not isinstance(outputs, dict) or sum(where.counts) == 0:
        return None, None
    logits, boxes = outputs.get("logits"), outputs.get("pred_boxes")
    if not isinstance(logits, torch.Tensor) or not isinstance(boxes, torch.Tensor) or logits.dim() != 3:
        return None, None
    if not all(isinstance(t, dict) and isinstance(t.get("class_labels"), torch.Tensor)
               and isinstance(t.get("boxes"), torch.Tensor) for t in targets):
        return None, None
    fam = _family(spec, m, logits.device.type)
    return (fam, _kind(m, outputs, targets)) if fam is not None else (None, None)


def _patched_forward(cls, own, spec: Matcher):
    sanitizes = _sanitizes(own)
    check = not sanitizes

    @functools.wraps(own)
    def forward(self, outputs, targets, *args, **kwargs):
        backend = None if _verified.get(cls) is False else _runs_here(outputs, cls)
        if backend is None:
            return own(self, outputs, targets, *args, **kwargs)
        checking = cls not in _verified
        groups = int(args[0] if args else kwargs.get("group_detr", 1)) if spec.grouped else 1
        if not checking and len(args) + len(kwargs) == spec.grouped and spec.layered:
            found = _served_again(self, outputs, targets, groups, backend, check)  # a call the loss named, matched
            if found is not None:
                return found
        logits = outputs["logits"]
        where = core.layout([core.count(t[spec.sizes_key]) for t in targets], logits.shape[1], groups, logits.device)
        if not checking and len(args) + len(kwargs) == spec.grouped and spec.layered:
            found = _served(self, outputs, targets, where, backend, check)  # a later layer of a stack matched at once
            if found is not None:
                return found
        fam, kind = _blocks_usable(spec, self, outputs, targets, where)
        blocks = _blocks_ok.get(kind) if fam is not None else False  # None: this kind not checked yet
        if not checking and len(args) + len(kwargs) == spec.grouped:
            found = None
            if blocks:  # each image's block, every layer of the stack at once
                found = _from_blocks(self, fam, kind, outputs, targets, where, backend, check, sanitizes,
                                     spec.layered)
            elif blocks is False and spec.layered:  # the matcher's own cost of every layer of the stack
                found = _from_layers(self, own, outputs, targets, where, backend, check, args, kwargs)
            if found is not None:
                return found
        # A checked call runs the matcher twice, and a cost may draw random numbers (RF-DETR's mask points): the taken
        # run draws from a copy of the generators, so that the matcher's own run draws the same numbers (the same
        # cost) and leaves the generators as an unpatched call does.
        generators = torch.random.fork_rng(devices=_cuda_devices(outputs)) if checking else contextlib.nullcontext()
        try:
            with generators, core.cost_at_cpu():
                result = own(self, outputs, targets, *args, **kwargs)
        except core.CostTaken as taken:
            cost = taken.cost
        else:  # it never copied a cost to the host: nothing to take over
            _verified[cls] = False
            STATE.say_once(f"lucid-assign: transformers' {cls.__name__} copied no cost to the host; it runs as it is")
            return own(self, outputs, targets, *args, **kwargs) if checking else result
        with torch.no_grad():
            problems = _problems(cost.detach(), where)
            ours = core.solve_call(problems, where, backend, check)
            if fam is not None and blocks is None:  # once per kind of call: the cost per block against the family's
                _verify_blocks(self, fam, kind, outputs, targets, where, sanitizes, problems)
        if checking:  # once per class and process: against the matcher's own forward
            theirs = own(self, outputs, targets, *args, **kwargs)
            _verified[cls] = _same(ours, theirs)
            if not _verified[cls]:
                STATE.report[cls.__name__] = "left to transformers (its first call matched differently)"
                STATE.say_once(f"lucid-assign: the patched {cls.__name__} matched differently from transformers' own "
                               "at its first call; it runs transformers' own matching from now on")
                return theirs
            what = f"transformers' {cls.__name__} matches on {cost.device} with lucid-assign's {backend}"
            STATE.verbose(what)
            STATE.announce(what, __version__)
        return ours

    forward.__lucid_patched__ = True
    return forward


def _tensors_only(targets: list) -> list | None:
    """The targets' values, image after image, where the targets are dicts of tensors only (one pass in C), else
    None."""
    try:
        values = list(itertools.chain.from_iterable(map(dict.values, targets)))
    except TypeError:  # a target that is not a dict
        return None
    return values if set(map(type, values)) <= {torch.Tensor} else None


def _stack_objects(targets: list) -> list:
    """The targets' tensors, on which a stack's matches depend besides its outputs (core.layered's ``objects``)."""
    values = _tensors_only(targets)
    return values if values is not None else [v for t in targets for v in t.values() if isinstance(v, torch.Tensor)]


def _keys(targets: list) -> list | None:
    """The targets' keys, image after image (core.layered's ``tag``: the same tensors under other keys are other
    targets), or None where a target is not a dict."""
    try:
        return list(itertools.chain.from_iterable(map(dict.keys, targets)))
    except TypeError:
        return None


def _served_again(m, outputs, targets: list, groups: int, backend: str, check: bool):
    """This call's matches where the loss call in progress named it and its first call matched it with the same
    targets, unchanged (core.served_again: told without the call's layout, which the targets' tensors give where they
    hold nothing else), else None."""
    if not isinstance(outputs, dict):
        return None
    logits, boxes = outputs.get("logits"), outputs.get("pred_boxes")
    values = _tensors_only(targets)
    if type(logits) is not torch.Tensor or type(boxes) is not torch.Tensor or values is None:
        return None
    return core.served_again(m, (logits, boxes), values, _keys(targets), groups, backend, check)


def _served(m, outputs, targets: list, where: core.Layout, backend: str, check: bool):
    """This call's matches where its outputs are a layer of a stack already matched at once by this loss call (the
    memo of core.layered serves the same call only), else None."""
    if not isinstance(outputs, dict) or not all(isinstance(t, dict) for t in targets):
        return None
    logits, boxes = outputs.get("logits"), outputs.get("pred_boxes")
    if not isinstance(logits, torch.Tensor) or not isinstance(boxes, torch.Tensor):
        return None
    return core.served(m, (logits, boxes), _stack_objects(targets), where, backend, check)


def _from_blocks(m, fam: _Family, kind: tuple, outputs: dict, targets: list, where: core.Layout, backend: str,
                 check: bool, sanitize: bool, layered: bool):
    """This call's matches from each image's cost block: of every layer of its outputs' stack at the stack's first
    call (core.layered), or of this call alone; None where a layer's boxes or the objects are not valid corners (the
    call then runs the family's own code, which raises)."""
    logits, boxes = outputs["logits"], outputs["pred_boxes"]

    def checked(stacks):
        # another output of the loss call (core.loss_call) may be of other dtypes: of another kind, whose cost per
        # block must have been checked (_blocks_ok) as this call's was
        mine = kind if (stacks[0].dtype, stacks[1].dtype) == kind[2:4] else kind[:2] + (
            stacks[0].dtype, stacks[1].dtype) + kind[4:]
        return mine if _blocks_ok.get(mine) is True else None

    def costs(stacks):
        mine = checked(stacks)
        return None if mine is None else _block_problems(m, fam, stacks, targets, where, sanitize, mine)

    def joined(views):  # a part of one layer may be its call's (B, Q, .) outputs; costs takes (L, B, Q, .) stacks
        found = _parts_problems(m, fam, [checked(v) for v in views], views, targets, where, sanitize)
        if found is not None:
            return found
        return core.by_dtypes([[v if v.dim() == 4 else v[None] for v in part] for part in views], costs)

    if layered:
        found = core.layered(m, (logits, boxes), _stack_objects(targets), where, costs, backend, check,
                             joined=joined, tag=_keys(targets), unstacked=logits.device.type in UNSTACKED_DEVICES)
        if found is not None:
            return found
    with torch.no_grad():
        return core.solve_call(costs([logits[None], boxes[None]]), where, backend, check)


def _verify_blocks(m, fam: _Family, kind: tuple, outputs: dict, targets: list, where: core.Layout, sanitize: bool,
                   theirs: torch.Tensor) -> None:
    """Whether this kind of call's cost per block equals, entry by entry, the problems of the cost that the family's
    own forward computed (``theirs``); a kind that differs keeps the family's cost, said once."""
    try:
        ours = _block_problems(m, fam, [outputs["logits"].detach()[None], outputs["pred_boxes"].detach()[None]],
                               targets, where, sanitize, kind)
        ours = None if bool(ours.declined) else ours.problems
    except Exception:  # an input the family takes and this replica does not
        ours = None
    _blocks_ok[kind] = ours is not None and _same_problems(ours, theirs, where)
    if not _blocks_ok[kind]:
        STATE.say_once(f"lucid-assign: transformers' {type(m).__name__} computes its cost otherwise than "
                       f"lucid-assign's per-image blocks reproduce ({kind[1]}, {kind[2]}); these calls keep its own "
                       "cost")


# --- the layers of one loss call matched at once ------------------------------------------------------------------
# The losses call the matcher once per decoder layer (RT-DETR: the last layer, then the others as auxiliary outputs,
# then the encoder's proposals), each call on one layer of the decoder's stacked outputs (a view of a (B, L, Q, C) or
# (L, B, Q, C) tensor). The first call on a layer of a stack computes the cost of every layer of that stack with the
# matcher's own forward (each layer's view as the loss would pass it: the same elements, strides and operations, so
# the same cost) and the core solves their problems in one call of the op (core.layered).


def _from_layers(m, own, outputs, targets: list, where: core.Layout, backend: str, check: bool, args: tuple,
                 kwargs: dict):
    """This call's matches from every layer of its outputs' stack (matched at the stack's first call), or None where
    its outputs are not one layer of a stack (the encoder's proposals, say) or a layer's cost could not be taken.
    ``args`` and ``kwargs``: the call's own beyond outputs and targets (LW-DETR's group_detr)."""
    if not isinstance(outputs, dict) or not all(isinstance(t, dict) for t in targets):
        return None
    logits, boxes = outputs.get("logits"), outputs.get("pred_boxes")
    if not isinstance(logits, torch.Tensor) or not isinstance(boxes, torch.Tensor):
        return None
    objects = _stack_objects(targets)

    def costs(stacks):
        problems = []
        for k in range(stacks[0].shape[0]):
            view = {"logits": stacks[0][k], "pred_boxes": stacks[1][k]}
            try:
                with core.cost_at_cpu():
                    own(m, view, targets, *args, **kwargs)
            except core.CostTaken as taken:  # cut to its problems at once: the full costs are not held together
                problems.append(_problems(taken.cost.detach(), where))
            except Exception:  # a layer the matcher refuses: every call on its own, the refusal at that layer's call
                return None
            else:
                return None
        return None if problems[0] is None else torch.cat(problems)

    return core.layered(m, (logits, boxes), objects, where, costs, backend, check, tag=_keys(targets))


def _loss_calls(outputs) -> list:
    """The (logits, pred_boxes) of each matcher call a loss makes of its ``outputs``: the last layer's, each auxiliary
    output's (RT-DETR's encoder proposals last among them) and the encoder's (LW-DETR)."""
    found = []
    for d in (outputs, *(outputs.get("auxiliary_outputs") or ()), outputs.get("enc_outputs")):
        if isinstance(d, dict) and isinstance(d.get("logits"), torch.Tensor) and isinstance(d.get("pred_boxes"),
                                                                                             torch.Tensor):
            found.append((d["logits"], d["pred_boxes"]))
    return found


def _patched_loss(own):
    """A loss's forward whose matcher calls are solved at once (core.loss_call) where its matcher is patched."""

    @functools.wraps(own)
    def forward(self, outputs, targets, *args, **kwargs):
        matcher = getattr(self, "matcher", None)
        if not isinstance(outputs, dict) or type(matcher) not in (STATE.originals or {}):
            return own(self, outputs, targets, *args, **kwargs)
        with core.loss_call(matcher, _loss_calls(outputs)):
            return own(self, outputs, targets, *args, **kwargs)

    forward.__lucid_patched__ = True
    return forward


def _cuda_devices(outputs) -> list:
    """The CUDA device of the matcher's inputs, as torch.random.fork_rng takes it (none on other devices)."""
    logits = outputs.get("logits") if isinstance(outputs, dict) else None
    return [logits.device] if isinstance(logits, torch.Tensor) and logits.device.type == "cuda" else []


def _runs_here(outputs, cls) -> str | None:
    """The backend of a patched call ("kernel" or "reference"), or None: the matcher's own forward."""
    logits = outputs.get("logits") if isinstance(outputs, dict) else None
    device = logits.device.type if isinstance(logits, torch.Tensor) else "cpu"
    return core.runs_here(STATE, STATE.backend, device, f"transformers' {cls.__name__}")


def _classes(where: dict | None = None) -> dict:
    """The matcher classes of the installed transformers (or the classes named in ``where``, name -> module): name ->
    class (None where this version has none)."""
    found = {}
    for name, module_name in ((n, spec.module) for n, spec in MATCHERS.items()) if where is None else where.items():
        try:
            module = importlib.import_module(module_name)
        except Exception:  # a version without that loss, or one that fails to import without SciPy
            module = None
        cls = getattr(module, name, None) if module is not None else None
        found[name] = cls if isinstance(cls, type) and "forward" in vars(cls) else None
    return found


def patch(backend: str = "auto") -> None:
    """Make transformers' DETR-family matchers match on the device with lucid-assign's op.

    ``backend``: "auto" (the kernel where it runs, else the matcher as it is, said once), "kernel" (raise where it
    cannot run) or "reference" (lucid-assign's pure solver). Idempotent; ``unpatch()`` restores the classes."""
    dispatch.resolve_backend(backend)  # refuses an unknown backend
    with STATE.lock:
        if STATE.originals is not None:
            STATE.backend = backend
            return
        try:
            import scipy.optimize  # noqa: F401
        except ImportError:
            scipy = False
        else:
            scipy = True
        STATE.report.clear()
        originals = {}
        for name, cls in _classes().items():
            if cls is None:
                STATE.report[name] = "not in this version of transformers"
            elif not scipy:
                STATE.report[name] = "left to transformers (no SciPy: it cannot match at all)"
            else:
                originals[cls] = vars(cls)["forward"]
                cls.forward = _patched_forward(cls, originals[cls], MATCHERS[name])
                STATE.report[name] = ("left to transformers (its first call matched differently)"
                                      if _verified.get(cls) is False else "patched")
        if originals:
            for cls in filter(None, _classes(LOSSES).values()):
                originals[cls] = vars(cls)["forward"]
                cls.forward = _patched_loss(originals[cls])
        STATE.originals, STATE.backend = originals, backend


def unpatch() -> None:
    """Restore every patched class's own forward."""
    with STATE.lock:
        for cls, forward in (STATE.originals or {}).items():
            cls.forward = forward
        STATE.originals = None


def is_patched() -> bool:
    return STATE.is_patched()


def patched(backend: str = "auto"):
    """Patch for the block, then restore what was there before it."""
    return _patching.patched(STATE, patch, unpatch, backend)


def patch_report() -> list:
    """One line per matcher class: patched, left to transformers (why), or not in this version."""
    return [f"{name}: {what}" for name, what in STATE.report.items()]
