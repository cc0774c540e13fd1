"""patch()'s check of the installed peer (ultralytics): each of its assigner classes run on built-in batches that reach
every rare rule of the contract, against lucid-assign's reference under each rule set (on the CPU, ties to the lower
index), so that a class is patched only with a rule set that gives its results bit for bit, never by its version
string."""

from __future__ import annotations

import inspect
import itertools

import torch
from torch.overrides import TorchFunctionMode

from .. import reference
from ..reference import INPUTS, SEG_INPUTS
from ..synthetic import check_batch, pose_batch, seg_batch
from ._peer import NAMES, accepted, find_peer

def _topk_lower_index(input, k, dim=-1, largest=True, sorted=True):
    """torch.topk with ties to the lower index (CUDA's order and the contract's rule; the CPU's own order differs)."""
    order = torch.sort(input, dim=dim, descending=largest, stable=True)
    return torch.return_types.topk((order.values.narrow(dim, 0, k), order.indices.narrow(dim, 0, k)))


class _TiesLow(TorchFunctionMode):
    """torch.topk and Tensor.topk with ties to the lower index, in the thread that enters it and only there (torch
    function modes are thread-local): the peer's assigner runs under it during the self-check, and no other code, in
    this thread or another, sees a changed top-k."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.topk or func is torch.Tensor.topk:
            func = _topk_lower_index
        return func(*args, **(kwargs or {}))


def _check_batches():
    """The built-in check batches (synthetic.check_batch: every rare rule of the contract), HBB and OBB, with the
    settings of the peer's losses (top-k 10; YOLO26's one-to-one assignment, top-k 7 with top-k2 1)."""
    for name, obb in (("TaskAlignedAssigner", False), ("RotatedTaskAlignedAssigner", True)):
        batch = check_batch(obb)
        inputs = [batch[k] for k in INPUTS]
        for topk, topk2 in ((10, None), (7, 1)):
            yield name, inputs, dict(topk=topk, topk2=topk2, num_classes=5, alpha=0.5, beta=6.0,
                                     stride=batch["stride"])


def _pose_check_batches():
    """The built-in pose check batch (synthetic.pose_batch: objects at every level and at the gate's edges, thin
    objects the gate would starve, invisible keypoints), with the settings of the peer's pose losses."""
    batch = pose_batch(batch=2, img_size=128, num_classes=5, objects=(6, 16), seed=3)
    inputs = [batch[k] for k in (*INPUTS, "anc_strides")]
    kpts = dict(pd_kpts=batch["pd_kpts"], gt_kpts=batch["gt_kpts"])
    for topk, topk2 in ((10, None), (7, 1)):
        kw = dict(topk=topk, topk2=topk2, num_classes=5, alpha=0.5, beta=6.0, stride=batch["stride"])
        yield inputs, kpts, batch["sigmas"], kw


def _seg_check_batches():
    """The built-in segmentation check batch (synthetic.seg_batch: overlapping, empty and box-filling masks, empty
    predicted masks), with the settings of the peer's segmentation losses."""
    batch = seg_batch(batch=2, img_size=128, num_classes=5, objects=(6, 16), mask_dim=8, seed=3)
    inputs = [batch[k] for k in INPUTS]
    masks = {k: batch[k] for k in SEG_INPUTS}
    for topk, topk2 in ((10, None), (7, 1)):
        yield inputs, masks, dict(topk=topk, topk2=topk2, num_classes=5, alpha=0.5, beta=6.0, stride=batch["stride"])


def _runs(tal, name):
    """(settings, our reference for a rule set, the peer's outputs) of the built-in batches for the peer's class
    ``name``, the peer run on the CPU with ties to the lower index."""
    cls = getattr(tal, name)
    takes_topk2 = _takes_topk2(cls)
    if name == "PoseTaskAlignedAssigner":
        batches = [(inputs, dict(kpts, sigmas=sigmas), kw) for inputs, kpts, sigmas, kw in _pose_check_batches()]
    elif name == "SegTaskAlignedAssigner":
        batches = list(_seg_check_batches())
    else:
        batches = [(inputs, {}, kw) for n, inputs, kw in _check_batches() if n == name]
    for inputs, extra, kw in batches:
        if kw["topk2"] is not None and not takes_topk2:
            continue
        extra = dict(extra)
        sigmas = extra.pop("sigmas", None)
        peer = cls(*(() if sigmas is None else (sigmas,)), **accepted(cls, kw))
        args = inputs
        if sigmas is not None and "anc_strides" not in inspect.signature(cls.forward).parameters:
            args = inputs[:-1]  # releases before 8.4.187 take no strides (and have no level gate)
        with torch.no_grad(), _TiesLow():  # on copies: a release that modifies its inputs differs
            theirs = peer(*(t.clone() for t in args), **{k: v.clone() for k, v in extra.items()})

        def ours(rules, dense, inputs=inputs, extra=extra, sigmas=sigmas, kw=kw):
            kw = dict(kw, rules=rules, dense_metrics=dense)
            if name == "PoseTaskAlignedAssigner":
                return reference.assign_pose(*inputs, extra["pd_kpts"], extra["gt_kpts"], sigmas, **kw)
            if name == "SegTaskAlignedAssigner":
                return reference.assign_seg(*inputs, *extra.values(), **kw)
            return reference.assign(*inputs, **kw)

        yield kw, ours, theirs


def _takes_topk2(cls) -> bool:
    """Whether the peer's class has the second top-k (8.4 and later); 8.0 to 8.3 have none."""
    return "topk2" in accepted(cls, {"topk2": 1})


def _first_difference(kw, ours, theirs) -> str | None:
    names = ("target_labels", "target_bboxes", "target_scores", "fg_mask", "target_gt_idx")
    for out, a, b in zip(names, ours, theirs):
        if a.shape != b.shape or not torch.equal(a.to(b.dtype), b):
            count = int((a.to(b.dtype) != b).sum()) if a.shape == b.shape else "shape"
            return f"topk={kw['topk']}, topk2={kw['topk2']}: {out} differs ({count} elements)"
    return None


def check_peer(tal=None) -> dict:
    """For each assigner class of the peer's module ``tal``: ``(rules, detail)``, the first rule set
    (reference.RULE_SETS; the default first, then the newest) under which lucid-assign's reference gives the class's
    outputs bit for bit on the built-in batches (the CPU, ties to the lower index), or ``(None, why)`` when none does.
    Classes the release lacks are absent."""
    if tal is None:
        tal = find_peer().tal
    found = {}
    for name in NAMES:
        if not isinstance(getattr(tal, name, None), type):
            continue
        try:
            runs = list(_runs(tal, name))
        except Exception as exc:  # a release whose class cannot run the built-in batch is left to itself
            found[name] = None, f"its check raised {type(exc).__name__}: {exc}"
            continue
        # the default first, then the others newest first; 8.0 only, and first, for a class without the top-k2
        # of later releases
        newer = [reference.DEFAULT_RULES,
                 *(r for r in reversed(reference.RULE_SETS) if r not in ("8.0", reference.DEFAULT_RULES))]
        first = None
        for rules, dense in itertools.product(newer if _takes_topk2(getattr(tal, name)) else ["8.0", *newer],
                                              (False, True)):
            diff = next(filter(None, (_first_difference(kw, ours(rules, dense), theirs)
                                      for kw, ours, theirs in runs)), None)
            if diff is None:
                found[name] = rules, f"rule set {rules}"
                break
            first = first or f"{diff} under rule set {rules}"
        else:
            found[name] = None, f"no rule set gives its results ({first})"
    return found


def self_check(tal=None) -> str | None:
    """None when every assigner class of the peer's module ``tal`` (default: the installed peer's) gives the results
    of lucid-assign's reference under one of its rule sets on the built-in batches, else what differs."""
    bad = [f"{name}: {why}" for name, (rules, why) in check_peer(tal).items() if rules is None]
    return "; ".join(bad) or None
