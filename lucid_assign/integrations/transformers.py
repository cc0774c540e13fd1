"""transformers' DETR-family matchers on lucid-assign's batched linear sum assignment.

Every detection matcher of ``transformers/loss/`` computes a (batch, queries, all objects of the batch) cost on the
device, copies it to the host (``.view(batch, queries, -1).cpu()``), splits it by the images' object counts and calls
SciPy's ``linear_sum_assignment`` once per image (LW-DETR's and RF-DETR's once per image and query group). patch()
replaces each matcher's ``forward``: the matcher's own code computes its cost, exactly as unpatched, up to the copy
to the host; there the patched forward takes the cost on its device and matches every image (and group) in one call
of ``torch.ops.lucid.linear_sum_assignment``, SciPy's choice, ties included. It returns what the matcher returns: per
image the matched queries in ascending order and their objects, int64 index tensors, on the cost's device (the
matcher's are on the CPU).

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
from typing import NamedTuple

import torch

from .. import __version__, dispatch
from . import _matching as core
from ._patching import TRANSFORMERS as STATE


class Matcher(NamedTuple):
    module: str  # where transformers defines it
    sizes_key: str  # the targets' key whose length is an image's object count (the matcher's own)
    grouped: bool  # forward(outputs, targets, group_detr): the queries in group_detr groups, each matched alone
    layered: bool  # its cost reads only outputs["logits"] and outputs["pred_boxes"], and draws no random numbers:
    # the layers of a decoder's stacked outputs can be matched at once (_from_layers)


# transformers 5.x, transformers/loss/ (docs/usage.md, "transformers")
MATCHERS = {
    "HungarianMatcher": Matcher("transformers.loss.loss_for_object_detection", "boxes", False, True),
    "DeformableDetrHungarianMatcher": Matcher("transformers.loss.loss_deformable_detr", "boxes", False, True),
    "RTDetrHungarianMatcher": Matcher("transformers.loss.loss_rt_detr", "boxes", False, True),
    "LwDetrHungarianMatcher": Matcher("transformers.loss.loss_lw_detr", "boxes", True, True),
    "RfDetrHungarianMatcher": Matcher("transformers.loss.loss_rf_detr", "masks", True, False),
    "GroundingDinoHungarianMatcher": Matcher("transformers.loss.loss_grounding_dino", "boxes", False, False),
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


def _patched_forward(cls, own, spec: Matcher):
    check = not _sanitizes(own)

    @functools.wraps(own)
    def forward(self, outputs, targets, *args, **kwargs):
        backend = None if _verified.get(cls) is False else _runs_here(outputs, cls)
        if backend is None:
            return own(self, outputs, targets, *args, **kwargs)
        checking = cls not in _verified
        groups = int(args[0] if args else kwargs.get("group_detr", 1)) if spec.grouped else 1
        logits = outputs["logits"]
        where = core.layout([len(t[spec.sizes_key]) for t in targets], logits.shape[1], groups, logits.device)
        if spec.layered and not checking and len(args) + len(kwargs) == spec.grouped:
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
            ours = core.solve_call(_problems(cost.detach(), where), where, backend, check)
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
    objects = [v for t in targets for v in t.values() if isinstance(v, torch.Tensor)]

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

    return core.layered(m, (logits, boxes), objects, where, costs, backend, check)


def _cuda_devices(outputs) -> list:
    """The CUDA device of the matcher's inputs, as torch.random.fork_rng takes it (none on other devices)."""
    logits = outputs.get("logits") if isinstance(outputs, dict) else None
    return [logits.device] if isinstance(logits, torch.Tensor) and logits.device.type == "cuda" else []


def _runs_here(outputs, cls) -> str | None:
    """The backend of a patched call ("kernel" or "reference"), or None: the matcher's own forward."""
    logits = outputs.get("logits") if isinstance(outputs, dict) else None
    device = logits.device.type if isinstance(logits, torch.Tensor) else "cpu"
    return core.runs_here(STATE, STATE.backend, device, f"transformers' {cls.__name__}")


def _classes() -> dict:
    """The matcher classes of the installed transformers: name -> class (None where this version has none)."""
    found = {}
    for name, spec in MATCHERS.items():
        try:
            module = importlib.import_module(spec.module)
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
        STATE.originals, STATE.backend = originals, backend


def unpatch() -> None:
    """Restore every patched class's own forward."""
    with STATE.lock:
        for cls, forward in (STATE.originals or {}).items():
            cls.forward = forward
        STATE.originals = None


def is_patched() -> bool:
    return STATE.is_patched()


@contextlib.contextmanager
def patched(backend: str = "auto"):
    """Patch for the block, then restore what was there before it."""
    was, before = is_patched(), STATE.backend
    patch(backend)
    try:
        yield
    finally:
        if was:
            patch(before)
        else:
            unpatch()


def patch_report() -> list:
    """One line per matcher class: patched, left to transformers (why), or not in this version."""
    return [f"{name}: {what}" for name, what in STATE.report.items()]
