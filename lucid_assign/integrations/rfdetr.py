"""RF-DETR's matcher (rfdetr 1.11) on lucid-assign's batched linear sum assignment.

RF-DETR's ``SetCriterion`` matches the final decoder layer, the auxiliary layers and the two-stage encoder output of a
step, each in ``group_detr`` query groups. Its ``HungarianMatcher`` builds each layer's cost per image block (objects
padded to the batch's most) and solves either every layer at once with torch-linear-assignment on CUDA (problems
zero-padded to the most objects, in float32) or each image and group with SciPy; it matches each layer apart, with
SciPy, when the layers' dtypes differ, and for batch 1, masks and keypoints.

patch() hands every one of those solves to ``torch.ops.lucid.linear_sum_assignment``: SciPy's choice on each layer's
own cost, ties included, ragged (no padding), on the cost's device. ``_match_many``, the criterion's call for all
layers of a step, gives one op call in every case (_route):

- a detection step ("batched", and "layers": the layers' dtypes differ, as under bf16 autocast): every layer's cost
  per image block at once, RF-DETR's values (its own terms, in its dtypes; on the CPU from detr_cost.parts, each
  layer's class term on the tensor RF-DETR computes it on), one synchronisation for RF-DETR's own checks, and the
  matches stay on the device;
- any other step (masks, keypoints, batch 1, fixed-row padding; "layers" on the CPU without the compiled op): each
  layer's cost as RF-DETR's own ``forward`` computes it (taken where it hands it to its solver), then all layers in one
  op call; the matches on the CPU, as RF-DETR returns them.

Where RF-DETR's own checks fail, the layers go where RF-DETR sends them (each layer's ``forward``, whose solve is the
op too). The first call of each kind of detection step in a process also computes the costs RF-DETR's own way and
compares them bit for bit; a kind that differs has RF-DETR compute its costs from then on (the solves still on the
op), said once.

    from lucid_assign.integrations import rfdetr as lucid_rfdetr
    lucid_rfdetr.patch()   # before RFDETRSmall().train(...); unpatch() restores RF-DETR's own
"""

from __future__ import annotations

import threading
from typing import NamedTuple

import torch

from .. import __version__, _library, dispatch, ops
from . import _matching as core
from . import _patching
from ._patching import RFDETR as STATE

# what patch() replaces, and what the patched code calls, of rfdetr 1.11's HungarianMatcher
_REPLACED = ("_match_many", "_assign_compact_cost_matrix")
_USED = ("_compute_compact_detection_cost_matrix", "_compute_stacked_compact_cost_matrices",
         "_focal_classification_cost", "_target_side_precheck", "_compact_path_applicable", "_resolve_l1_cost")

_verified: dict = {}  # kind of batched call -> its costs equal RF-DETR's own (checked at its first call)
# The devices whose detection steps take RF-DETR's cost from torch.ops.lucid.detr_cost.parts (class_term "rfdetr":
# every layer in one call, each entry RF-DETR's chain of operations in its dtypes; on the CPU the focal term from its
# own ATen operations on its own gathered tensor, on CUDA the op's kernel).
COST_DEVICES = ("cpu", "cuda")
_plans: dict = {}  # (device, autocast region, dtypes) -> the op's dtypes (ops.FAMILY_DTYPES -> dtype), or None
_taking = threading.local()  # .on: RF-DETR's solvers hand back the cost instead of solving (this thread)


def _cost_op_on(device: torch.device) -> bool:
    """Whether detection steps on ``device`` take RF-DETR's cost from detr_cost.parts (COST_DEVICES, and built)."""
    return device.type in COST_DEVICES and _library.has_kernel("detr_cost", device.type)


class _Taken(NamedTuple):
    """A cost RF-DETR's own code handed to its solver while taken: (queries, sum(sizes)) and how to split it."""

    cost: torch.Tensor
    sizes: tuple
    groups: int


def _modules():
    from rfdetr.models import _assignment, matcher

    return matcher, _assignment


def _box_ops():
    from rfdetr.utilities import box_ops

    return box_ops


def _backend(device: torch.device) -> str | None:
    """The backend of a patched call on ``device`` ("kernel" or "reference"), or None: RF-DETR's own solver."""
    return core.runs_here(STATE, STATE.backend, device.type, "RF-DETR matcher")


def _check_groups(queries: int, groups: int) -> None:
    if groups < 1 or queries % groups:
        raise ValueError(f"num_queries ({queries}) must be divisible by group_detr ({groups})")


def _empty(layers: int, images: int, device) -> list:
    empty = torch.zeros(0, dtype=torch.int64, device=device)
    return [[(empty, empty) for _ in range(images)] for _ in range(layers)]


def _split(rows, cols, where: core.Layout, layers: int) -> list:
    """RF-DETR's form of the op's outputs: per layer, per image, (queries, objects) int64, its groups one after the
    other (each group's queries ascending, offset by the group's first query), the objects indexed in the image."""
    found = core.matches(rows, cols, where, layers)
    images = len(where.counts)
    return [found[k * images:(k + 1) * images] for k in range(layers)]


def solve_blocks(costs: list, sizes, groups: int, backend: str, host: bool) -> list:
    """Per cost (each (queries, sum(sizes)): image b's objects in its block of columns; all of one device and query
    count), per image, the matches (_split) of its ``groups`` query groups, in one call of the op. ``host``: the
    matches on the CPU (one transfer), as RF-DETR returns them; else on the costs' device. On the CPU a problem SciPy
    refuses raises SciPy's error (RF-DETR's solver only sees finite costs)."""
    sizes = [int(n) for n in sizes]
    queries, device = costs[0].shape[0], costs[0].device
    _check_groups(queries, groups)
    layers, images = len(costs), len(sizes)
    if sum(sizes) == 0:
        return _empty(layers, images, "cpu" if host else device)
    where = core.layout(sizes, queries, groups, device)
    stack = torch.stack(costs) if layers > 1 else costs[0][None]
    shape = (layers, images, queries, where.width)
    blocks = stack[:, None].expand(layers, images, *stack.shape[1:]).gather(3, where.columns[None, :, None].expand(
        shape))
    rows, cols, info = core.solve(blocks.view(layers * images * groups, queries // groups, where.width), where,
                                  backend, layers)
    if device.type == "cpu":
        for k in range(layers):
            core.raise_refused(info.view(layers, -1)[k], where)
    if host and device.type != "cpu":
        pair = torch.stack((rows, cols)).cpu()
        return _split(pair[0], pair[1], core.layout(sizes, queries, groups, "cpu"), layers)
    return _split(rows, cols, where, layers)


# --- RF-DETR's two solvers, replaced ---------------------------------------------------------------------------------


def _assign_compact_cost_matrix(cost_matrix, sizes, group_detr):
    """RF-DETR's SciPy loop over groups and images of one (queries, sum(sizes)) cost, on the op."""
    if getattr(_taking, "on", False):
        return _Taken(cost_matrix, tuple(sizes), group_detr)
    backend = _backend(cost_matrix.device)
    if backend is None:
        return STATE.original("_assign_compact_cost_matrix")(cost_matrix, sizes, group_detr)
    return solve_blocks([cost_matrix], sizes, group_detr, backend, host=True)[0]


def assign_many_bucketed(cost_matrices, sizes, group_detr):
    """RF-DETR's batched solve of the layers' (queries, sum(sizes)) costs (torch-linear-assignment on problems padded
    to the most objects), on the op: ragged, SciPy's choice."""
    if getattr(_taking, "on", False):
        return [_Taken(m, tuple(sizes), group_detr) for m in cost_matrices]
    backend = _backend(cost_matrices[0].device)
    if backend is None:
        return STATE.original("assign_many_bucketed")(cost_matrices, sizes, group_detr)
    return _solve_taken([_Taken(m, tuple(sizes), group_detr) for m in cost_matrices], backend)


def _solve_taken(taken: list, backend: str) -> list:
    """Each taken cost's matches (on the CPU), those alike in queries, sizes and groups in one op call: on the
    accelerator where some are there (RF-DETR copies a layer's cost to the host on some paths and not on others)."""
    found: list = [None] * len(taken)
    alike: dict = {}
    devices = {t.cost.device for t in taken} - {torch.device("cpu")}
    device = devices.pop() if len(devices) == 1 else None
    for i, t in enumerate(taken):
        alike.setdefault((t.cost.device if device is None else device, t.cost.shape[0], t.sizes, t.groups),
                         []).append(i)
    for (where, _, sizes, groups), members in alike.items():
        costs = [taken[i].cost.to(where, non_blocking=True) for i in members]
        solved = solve_blocks(costs, sizes, groups, backend, host=True)
        for i, matches in zip(members, solved):
            found[i] = matches
    return found


# --- the criterion's call for every layer of a step ------------------------------------------------------------------


def _route(m, outputs_list: list, targets: list) -> str:
    """How a detection step's layers are matched here, as RF-DETR would match them:
    - "batched": RF-DETR's own _match_many takes them together (the layers alike in dtypes, the objects' boxes in the
      boxes' dtype); its checks decline all or none;
    - "layers": RF-DETR declines its batched path (the layers' dtypes differ: the encoder's boxes in bf16 under
      autocast) and its criterion calls each layer's forward, whose cost is per image block where the objects' boxes
      have the layer's dtype, else over the batch's cross product (only its image blocks are solved): these are
      computed per image block here too, on CUDA, and on the CPU by detr_cost.parts (whose class term is computed on
      the tensors each forward computes it on, as the CPU's vectorised math rounds an element by its place);
    - "forwards": anything else (masks, keypoints, batch 1, fixed-row padding, other query counts, the CPU's
      "layers" without the op): each layer's own forward, its cost taken."""
    if not targets or "valid" in targets[0] or not all(m._compact_path_applicable(o, targets) for o in outputs_list):
        return "forwards"
    boxes, logits = outputs_list[0]["pred_boxes"], outputs_list[0]["pred_logits"]
    device = boxes.device
    if not (all(o["pred_boxes"].device == device and o["pred_logits"].device == device
                and o["pred_logits"].shape[1:] == logits.shape[1:] for o in outputs_list)
            and all(t["boxes"].dtype == targets[0]["boxes"].dtype and t["boxes"].device == device
                    and t["labels"].device == device and t["labels"].dtype == targets[0]["labels"].dtype
                    for t in targets)):
        return "forwards"
    if all(o["pred_boxes"].dtype == boxes.dtype and o["pred_logits"].dtype == logits.dtype
           for o in outputs_list) and targets[0]["boxes"].dtype == boxes.dtype:
        return "batched"
    return "layers" if device.type == "cuda" or _cost_op_on(device) else "forwards"


def _minus_giou(box_area, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """-GIoU of (n, Q, 4) corner boxes against (n, T, 4): (n, Q, T), RF-DETR's formula (its box areas, its 1e-7
    floors of the union and of the enclosing area), the operations of its 2-D function (dtypes promoted where they
    are), as broadcasts. ``box_area``: RF-DETR's (torchvision's: narrow floats widened to float32)."""
    area_a = box_area(a.reshape(-1, 4)).view(*a.shape[:2], 1)
    area_b = box_area(b.reshape(-1, 4)).view(b.shape[0], 1, b.shape[1])
    a, b = a[:, :, None], b[:, None]
    wh = (torch.min(a[..., 2:], b[..., 2:]) - torch.max(a[..., :2], b[..., :2])).clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]
    union = area_a + area_b - inter
    iou = inter / union.clamp(min=1e-7)
    wh = (torch.max(a[..., 2:], b[..., 2:]) - torch.min(a[..., :2], b[..., :2])).clamp(min=0)
    enclosing = wh[..., 0] * wh[..., 1]
    return -(iou - (enclosing - union) / enclosing.clamp(min=1e-7))


def _cost(m, mod, logits, boxes, labels, objects):
    """RF-DETR's detection cost of images against their padded objects: its focal and L1 terms (its own methods; the
    plain L1 function where the dtypes differ, as its forward), its GIoU, its weighted sum; (n, queries, most
    objects), float32."""
    n, queries = logits.shape[:2]
    focal = m._focal_classification_cost(torch.gather(logits, 2, labels[:, None, :].expand(n, queries,
                                                                                           labels.shape[1])))
    l1 = (m._resolve_l1_cost() if boxes.dtype == objects.dtype else mod.pairwise_box_l1_cost)(boxes, objects)
    giou = _minus_giou(_box_ops().box_area, mod.box_cxcywh_to_xyxy(boxes), mod.box_cxcywh_to_xyxy(objects))
    return (m.cost_bbox * l1 + m.cost_class * focal + m.cost_giou * giou).float()


def _dtype_plan(m, mod, logits, boxes, objects) -> dict | None:
    """The dtype of each step of RF-DETR's detection cost in this call's autocast region (ops.FAMILY_DTYPES), read
    off its own operations on one element (once per device, region and dtypes); None where the op cannot give it: a
    step not float32, bfloat16 or float16, its focal term's not that of its powers times its logs, its L1 or the cost
    not float32."""
    device = logits.device.type
    region = (torch.is_autocast_enabled(device), torch.get_autocast_dtype(device)) if device in ("cpu", "cuda") else ()
    key = (device, region, logits.dtype, boxes.dtype, objects.dtype)
    if key not in _plans:
        plan = None
        try:
            with torch.no_grad():
                x = logits.new_zeros((1, 1))
                p = x.sigmoid()
                power, log = (p ** mod._FOCAL_LOSS_GAMMA).dtype, torch.nn.functional.logsigmoid(x).dtype
                cls = m._focal_classification_cost(x).dtype
                l1 = mod.pairwise_box_l1_cost(boxes.new_zeros((1, 4)), objects.new_zeros((1, 4))).dtype
            found = dict(prob=p.dtype, pow=power, log=log, cls=cls, l1=l1, pred_corners=boxes.dtype,
                         gt_corners=objects.dtype, pairs=torch.promote_types(boxes.dtype, objects.dtype),
                         sum=torch.promote_types(l1, cls))
            if (all(d in ops.DTYPE_CODES for d in found.values()) and cls == torch.promote_types(power, log)
                    and l1 == found["sum"] == torch.float32):
                plan = found
        except Exception:  # a region or dtypes in which RF-DETR's own operations fail: its own cost then
            plan = None
        _plans[key] = plan
    return _plans[key]


def _op_cost(m, mod, together: list, stacks: list, labels, objects, where: core.Layout, route: str = "batched"):
    """Every layer's (cost, invalid) from one call of detr_cost.parts: the cost (layers * images * groups, queries /
    groups, width) in the layers' order, invalid nonzero where RF-DETR's checks of the queries' boxes or of the costs
    fail (a coordinate not finite or beyond its bound, a cost not finite, so a label outside the classes too); each
    part the layers ``together[i]`` (computed together, as RF-DETR stacks them), its logits and boxes ``stacks[i]``
    (stacked, or a layer's own for a part of one); labels (N,) and objects (N, 4) the batch's, image after image;
    ``route`` "layers" on the CPU: each layer's class term as its forward computes it (class term "rfdetr-layers").
    None where the op cannot give it (a part without a dtype plan, a setting not a number)."""
    gains = (m.cost_class, m.cost_bbox, m.cost_giou)
    if not all(isinstance(g, (int, float)) for g in (*gains, m.focal_alpha)):
        return None
    plans = [_dtype_plan(m, mod, logits, boxes, objects) for logits, boxes in stacks]
    if any(plan is None for plan in plans):
        return None
    cost, invalid = ops.detr_family_parts_cost([s[0] for s in stacks], [s[1] for s in stacks], labels, objects,
                                               where.image_sizes, where.width, where.groups, gains,
                                               class_term="rfdetr-layers" if route == "layers" and
                                               objects.device.type == "cpu" else "rfdetr",
                                               alpha=m.focal_alpha, gamma=mod._FOCAL_LOSS_GAMMA,
                                               l1_order=0 if objects.device.type == "cpu" else 1, dtypes=plans,
                                               sanitize=False)
    order = [k for ks in together for k in ks]
    if order != sorted(order):  # the parts' layers back in the layers' order
        cost = cost.view(len(order), -1, *cost.shape[1:])[torch.tensor(order, device=cost.device).argsort()]
    return cost, invalid


def _as_theirs(cost: torch.Tensor, sizes: list, layers: int) -> list:
    """Each layer's (queries, sum(sizes)) cost, RF-DETR's form, of (layers * images, queries, most objects) blocks."""
    images = len(sizes)
    return [torch.cat([cost[k * images + b, :, :n] for b, n in enumerate(sizes)], dim=-1) for k in range(layers)]


def _their_costs(m, outputs_list, targets, groups, safety, route: str, stacks: bool) -> list:
    """Each layer's (queries, sum(sizes)) cost as RF-DETR computes it: its _match_many's ("batched"), or its
    forward's (taken)."""
    if route == "layers":
        return [t.cost for t in _taken(m, outputs_list, targets, groups, safety)]
    if stacks:
        costs = m._compute_stacked_compact_cost_matrices(outputs_list, targets)
    else:
        costs = [m._compute_compact_detection_cost_matrix(o, targets, clamp_target_labels=True) for o in outputs_list]
    return [c.float() for c in costs]


def _from_blocks(m, outputs_list: list, targets: list, groups: int, safety, backend: str, route: str):
    """Every layer's matches of a detection step (on the device), each layer's cost per image block: RF-DETR's values
    (route "batched" or "layers", _route). One synchronisation, for RF-DETR's own checks of the boxes, labels and
    costs; where they fail: None for "batched" (RF-DETR declines; the criterion calls each layer's forward), each
    layer's own forward (taken) for "layers"."""
    mod, _ = _modules()
    boxes0, logits0 = outputs_list[0]["pred_boxes"], outputs_list[0]["pred_logits"]
    device, classes, queries = boxes0.device, logits0.shape[-1], logits0.shape[1]
    layers, images = len(outputs_list), len(targets)
    sizes = [core.count(t["boxes"]) for t in targets]
    if sum(sizes) == 0:  # RF-DETR's per-layer calls: no object, no match
        return _empty(layers, images, "cpu")
    _check_groups(queries, groups)
    where = core.layout(sizes, queries, groups, device)
    width, object_dtype = where.width, targets[0]["boxes"].dtype
    # RF-DETR stacks the layers' costs up to a size, per layer above it (its forward: per layer). On CUDA an entry's
    # value is the same either way (elementwise kernels), so alike layers go at once; on the CPU a vectorised loop's
    # tail may round differently, so RF-DETR's own choice is kept (the op's "rfdetr-layers" computes each layer as its
    # forward does, whatever its parts).
    stacks = layers * images * queries * width <= mod._STACKED_COST_ELEMENT_LIMIT
    alike: dict = {}
    for k, o in enumerate(outputs_list):
        alike.setdefault((o["pred_logits"].dtype, o["pred_boxes"].dtype), []).append(k)
    together = list(alike.values()) if device.type == "cuda" or stacks or route == "layers" else \
        [[k] for ks in alike.values() for k in ks]
    found = None
    if _cost_op_on(device):  # every layer's cost in one op call, its parts the layers computed together (a part of
        # one layer as it is)
        def stacked(ks, key):
            return torch.stack([outputs_list[k][key] for k in ks]) if len(ks) > 1 else outputs_list[ks[0]][key]

        boxes_of = [stacked(ks, "pred_boxes") for ks in together]
        labels = torch.cat([t["labels"] for t in targets])
        parts = [(stacked(ks, "pred_logits"), boxes) for ks, boxes in zip(together, boxes_of)]
        found = _op_cost(m, mod, together, parts, labels, torch.cat([t["boxes"] for t in targets]), where, route)
        if found is not None:  # the op checked every query's box as RF-DETR does, and that every cost is finite
            problems, invalid = found
            units = [(ks, boxes, False) for ks, boxes in zip(together, boxes_of)]
    if found is None and route == "layers" and device.type == "cpu":  # its forwards' tensors are not these blocks
        return _from_forwards(m, outputs_list, targets, groups, safety, backend)
    if found is None:  # RF-DETR's operations on every layer's padded blocks
        pad = torch.nn.utils.rnn.pad_sequence
        labels = pad([t["labels"] for t in targets], batch_first=True)
        objects = pad([t["boxes"] for t in targets], batch_first=True)
        safe_labels = labels.clamp(0, classes - 1)  # (out of range: declined below, before any use)
        parts, units = [], []  # parts: (layers, their costs (len(layers) * images, queries, width))
        for members in alike.values():  # units: (layers, their boxes, whether they are checked here)
            units.append((members, torch.cat([outputs_list[k]["pred_boxes"] for k in members]), True))
            for ks in together:
                if ks[0] in members:
                    n = len(ks)  # the group's layers, or one of them
                    logits = torch.cat([outputs_list[k]["pred_logits"] for k in ks]) if n > 1 else \
                        outputs_list[ks[0]]["pred_logits"]
                    boxes = units[-1][1] if n == len(members) else outputs_list[ks[0]]["pred_boxes"]
                    parts.append((ks, _cost(m, mod, logits, boxes, safe_labels.repeat(n, 1), objects.repeat(n, 1, 1))))
        if len(parts) == 1:
            cost = parts[0][1]
        else:
            of_layer = {k: part[i * images:(i + 1) * images] for ks, part in parts for i, k in enumerate(ks)}
            cost = torch.cat([of_layer[k] for k in range(layers)])
        # RF-DETR checks its costs' entries; the padding columns here are finite where those are but for a non-finite
        # logit of class 0 (the padding's label): then this declines where RF-DETR would not, and RF-DETR's own path
        # matches (the same matches, slower)
        invalid = ~torch.isfinite(cost).all()
        problems = cost.view(layers * images * groups, queries // groups, width)
    ok, checked = invalid == 0, {}  # RF-DETR's checks, one value read
    for _, boxes, check_boxes in units:
        box_dtype = boxes.dtype
        if box_dtype == object_dtype:  # RF-DETR's compact cost: its checks of the objects and of the boxes (finite
            # and within its bound: NaN fails the comparison)
            if box_dtype not in checked:
                checked[box_dtype] = (safety.safe if (safety is not None and safety.targets is targets
                                                      and safety.pred_boxes_dtype == box_dtype
                                                      and safety.pred_boxes_device == device
                                                      and safety.num_classes == classes)
                                      else m._target_side_precheck(box_dtype, device, classes, targets))
                ok = ok & checked[box_dtype]
            if check_boxes:
                ok = ok & (boxes.abs() <= torch.finfo(box_dtype).max ** 0.5 / 16).all()
        elif "labels" not in checked and found is None:  # its cost over the cross product ("layers" only): the
            # labels index the logits (the op's cost of a label outside them is NaN, so invalid says it)
            checked["labels"] = (labels >= 0).all() & (labels < classes).all()
            ok = ok & checked["labels"]
    if not bool(ok):
        return None if route == "batched" else _from_forwards(m, outputs_list, targets, groups, safety, backend)
    kind = (device.type, route, stacks if device.type == "cpu" else None, found is not None,
            tuple((o["pred_logits"].dtype, o["pred_boxes"].dtype) for o in outputs_list), object_dtype)
    if kind not in _verified:  # once per kind of call: our costs against RF-DETR's own
        theirs = _their_costs(m, outputs_list, targets, groups, safety, route, stacks)
        ours = _as_theirs(problems.view(layers * images, queries, width), sizes, layers)
        same = all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(ours, theirs))
        _verified[kind] = same
        if not same:
            STATE.report["HungarianMatcher._match_many"] = "RF-DETR's own costs (a kind of call differed)"
            STATE.say_once("lucid-assign: the patched RF-DETR matcher's costs differed from RF-DETR's own for "
                           f"{kind}; such calls compute them RF-DETR's way from now on (the solves stay on the op)")
    if not _verified[kind]:
        if route == "batched":
            return STATE.original("_match_many")(m, outputs_list, targets, groups, safety)
        return _from_forwards(m, outputs_list, targets, groups, safety, backend)
    rows, cols, _ = core.solve(problems, where, backend, layers)
    return _split(rows, cols, where, layers)


def _taken(m, outputs_list: list, targets: list, groups: int, safety) -> list:
    """Each layer's forward, as RF-DETR's criterion calls it (its random draws in the same order), its cost taken
    where it hands it to its solver (a _Taken), or its result where it solved nothing."""
    _taking.on = True
    try:
        return [m.forward(o, targets, group_detr=groups, target_side_safety=safety) for o in outputs_list]
    finally:
        _taking.on = False


def _from_forwards(m, outputs_list: list, targets: list, groups: int, safety, backend: str) -> list:
    """Every layer's matches as RF-DETR's criterion gets them from each layer's forward (_taken), the solves of all
    layers in one op call."""
    got = _taken(m, outputs_list, targets, groups, safety)
    taken = [i for i, g in enumerate(got) if isinstance(g, _Taken)]
    for i, matches in zip(taken, _solve_taken([got[i] for i in taken], backend)):
        got[i] = matches
    return got


@torch.no_grad()
def _match_many(self, outputs_list, targets, group_detr=1, target_side_safety=None):
    """RF-DETR's call for every layer of a step (criterion), every solve in one op call."""
    own = STATE.original("_match_many")
    logits = outputs_list[0]["pred_logits"] if outputs_list else None
    backend = _backend(logits.device) if isinstance(logits, torch.Tensor) else None
    if backend is None or len(outputs_list) < 2:
        return own(self, outputs_list, targets, group_detr, target_side_safety)
    route = _route(self, outputs_list, targets)
    if route == "forwards":
        found = _from_forwards(self, outputs_list, targets, group_detr, target_side_safety, backend)
    else:
        found = _from_blocks(self, outputs_list, targets, group_detr, target_side_safety, backend, route)
    if not STATE.announced:
        what = f"RF-DETR's matcher ({route}) matches on {logits.device} with lucid-assign's {backend}"
        STATE.verbose(what)
        STATE.announce(what, __version__)
    return found


# --- patch ------------------------------------------------------------------------------------------------------------


def _reduce_ex(self, protocol):
    """How pickle takes a matcher while patched: as RF-DETR's own, rebuilt by _rebuilt, which first patches the process
    that unpickles it. Lightning's spawn-based DDP (RF-DETR's notebook strategy) pickles the criterion, its matcher
    with it, into fresh processes that import rfdetr unpatched: so each of them is patched too, with this backend."""
    rebuild, args, *rest = object.__reduce_ex__(self, protocol)
    return (_rebuilt, (STATE.backend, rebuild, args), *rest)


def _rebuilt(backend: str, rebuild, args):
    if STATE.originals is None:
        patch(backend)
        STATE.verbose(f"patched RF-DETR (backend {backend!r}) in a process that unpickled a patched matcher")
    return rebuild(*args)


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("rfdetr")
    except Exception:
        return "unknown"


def patch(backend: str = "auto") -> None:
    """Make RF-DETR's matcher solve on the device with lucid-assign's op (every layer of a step in one call).

    ``backend``: "auto" (the kernel where it runs, else RF-DETR's own solvers, said once), "kernel" (raise where it
    cannot run) or "reference" (lucid-assign's pure solver). Idempotent; ``unpatch()`` restores RF-DETR's own."""
    dispatch.resolve_backend(backend)  # refuses an unknown backend
    with STATE.lock:
        if STATE.originals is not None:
            STATE.backend = backend
            return
        STATE.report.clear()
        originals: dict = {}
        try:
            mod, assignment = _modules()
        except Exception as e:  # not installed, or a release that fails to import (without SciPy, say)
            STATE.report["HungarianMatcher"] = f"not patched: rfdetr.models cannot be imported ({e})"
        else:
            cls = mod.HungarianMatcher
            missing = [n for n in _REPLACED if n not in vars(cls)] + [n for n in _USED if not hasattr(cls, n)]
            missing += [n for n in ("assign_many_bucketed",) if not hasattr(assignment, n)]
            if missing:
                STATE.report["HungarianMatcher"] = (f"left to RF-DETR (rfdetr {_version()} has no {', '.join(missing)};"
                                                    " the patch knows rfdetr 1.11)")
            else:
                originals = {(cls, "_match_many"): vars(cls)["_match_many"],
                             (cls, "_assign_compact_cost_matrix"): vars(cls)["_assign_compact_cost_matrix"],
                             (assignment, "assign_many_bucketed"): assignment.assign_many_bucketed,
                             (cls, "__reduce_ex__"): vars(cls).get("__reduce_ex__")}  # None: inherited
                cls._match_many = _match_many
                cls._assign_compact_cost_matrix = staticmethod(_assign_compact_cost_matrix)
                assignment.assign_many_bucketed = assign_many_bucketed
                cls.__reduce_ex__ = _reduce_ex
                STATE.report["HungarianMatcher"] = "patched"
        STATE.originals, STATE.backend = originals, backend


def unpatch() -> None:
    """Restore RF-DETR's own matcher."""
    with STATE.lock:
        for (owner, name), obj in (STATE.originals or {}).items():
            if obj is None:  # inherited before patch()
                delattr(owner, name)
            else:
                setattr(owner, name, obj)
        STATE.originals = None


def is_patched() -> bool:
    return STATE.is_patched()


def patched(backend: str = "auto"):
    """Patch for the block, then restore what was there before it."""
    return _patching.patched(STATE, patch, unpatch, backend)


def patch_report() -> list:
    """What patch() did: patched, or left to RF-DETR (why)."""
    return [f"{name}: {what}" for name, what in STATE.report.items()]
