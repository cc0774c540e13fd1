"""torch.ops.lucid.detr_cost.family (docs/spec.md, "DETR family cost"): the cost of transformers' DETR-family
matchers, every layer of a loss call in one op, against the families' own operations (integrations.transformers'
per-block replica, _block_cost, which tests/test_transformers.py checks against each family's own forward): bit for
bit on the CPU with the family's class term given; on CUDA bit for bit with the class term computed in the op; its
padding, sanitising, corner check, errors and opcheck; and the patched matcher's guard, which a cost one unit in the
last place off fails."""

import contextlib
import re

import pytest
import torch

from conftest import devices, one_ulp_off

tf = pytest.importorskip("transformers")
pytest.importorskip("scipy")
from lucid_assign import FallbackWarning, ops  # noqa: E402
from lucid_assign.integrations import _matching as core, transformers as lt  # noqa: E402

FAMILIES = {  # the class term (transformers' matchers: DETR, Deformable DETR, RT-DETR with focal loss, LW-DETR)
    "softmax": lt._Family("softmax"),
    "focal": lt._Family("focal"),
    "focal-gathered": lt._Family("focal-gathered", 0.25, 2.0),
    "lw-detr": lt._Family("focal", l1_float32=True),
}


class Matcher:
    class_cost, bbox_cost, giou_cost = 2, 5, 2


def _batch(device, counts=(3, 0, 6), layers=3, queries=8, classes=5, seed=0, dtype=torch.float32):
    """Boxes that overlap, nest, repeat and miss, some of zero width; an image without objects."""
    g = torch.Generator().manual_seed(seed)
    bs = len(counts)
    logits = (torch.rand(layers, bs, queries, classes, generator=g) * 2 - 1) * 6
    boxes = torch.rand(layers, bs, queries, 4, generator=g) * 0.6 + 0.2
    boxes[..., 2:] *= 0.5
    boxes[:, 0, :2, 2] = 0.0
    total = sum(counts)
    objects = torch.rand(total, 4, generator=g) * 0.6 + 0.2
    objects[:, 2:] *= 0.5
    if total >= 3:
        objects[1] = objects[0]
        boxes[:, 0, 3] = objects[0]  # a query exactly on an object
    labels = torch.randint(0, classes, (total,), generator=g)
    return logits.to(device, dtype), boxes.to(device, dtype), labels.to(device), objects.to(device), list(counts)


def _theirs(m, fam, logits, boxes, labels, objects, where, sanitize=True):
    cost, valid = lt._block_cost(m, fam, logits, boxes, core.pad_objects(labels, where),
                                 core.pad_objects(objects, where), sanitize)
    layers, bs, nq, width = cost.shape
    return cost.reshape(layers * bs * where.groups, nq // where.groups, width), bool(valid.all())


def _ours(m, fam, logits, boxes, labels, objects, where, plan, sanitize=True, class_term=True):
    class_cost = None
    if class_term and logits.device.type == "cpu":  # as the integration gives it: the families' operations, one call
        class_cost = ops.family_class_terms(logits, labels, where.image_sizes, where.width, fam.class_term, fam.alpha,
                                            fam.gamma)
    elif class_term:
        class_cost = lt._class_terms(fam, logits, core.pad_objects(labels, where))
    scores = logits.softmax(-1) if fam.class_term == "softmax" and not class_term else logits
    return ops.detr_family_cost(scores, boxes, labels, objects, where.image_sizes, where.width, where.groups,
                                (m.class_cost, m.bbox_cost, m.giou_cost), focal=fam.class_term != "softmax",
                                alpha=fam.alpha, gamma=fam.gamma, l1_order=0 if logits.device.type == "cpu" else 1,
                                dtypes=plan, sanitize=sanitize, class_cost=class_cost)


def _same(ours, theirs, where) -> bool:
    """lt._same_problems (bit for bit on the problems' valid columns) for each layer's problems."""
    step = len(where.counts) * where.groups
    return ours.shape == theirs.shape and all(lt._same_problems(ours[k:k + step], theirs[k:k + step], where)
                                              for k in range(0, ours.shape[0], step))


def _plan(fam, logits, boxes, objects):
    lt._plans.clear()
    return lt._dtype_plan(Matcher(), fam, ("test",), logits, boxes, objects)


def _region(device, dtype):
    return torch.autocast(device, dtype=dtype) if dtype is not None else contextlib.nullcontext()


REGIONS = {"float32": (torch.float32, None), "bf16 autocast": (torch.bfloat16, torch.bfloat16)}


@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("region", list(REGIONS))
@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_op_is_the_family_cost_on_the_cpu(library, family, region, groups):
    """With the family's class term given (its probabilities are ATen's on the CPU), every entry of every layer's
    problems equals the family's own operations' (the sign of zero and NaN included), in float32 and in the dtypes
    bf16 autocast gives each step; the columns past an image's objects are 0."""
    fam, m = FAMILIES[family], Matcher()
    dtype, autocast = REGIONS[region]
    for seed in range(3):
        logits, boxes, labels, objects, counts = _batch("cpu", seed=seed, dtype=dtype)
        where = core.layout(counts, logits.shape[2], groups, "cpu")
        with _region("cpu", autocast):
            plan = _plan(fam, logits, boxes, objects)
            assert plan is not None
            theirs, valid = _theirs(m, fam, logits, boxes, labels, objects, where)
            ours, invalid = _ours(m, fam, logits, boxes, labels, objects, where, plan)
        assert valid and int(invalid) == 0
        assert _same(ours, theirs, where)
        past = torch.arange(where.width)[None, :] >= where.sizes[:, None]  # (problems, width)
        assert torch.all(ours.transpose(1, 2)[past.repeat(3, 1)] == 0)


@pytest.mark.parametrize("region", ["float32", "bf16 logits", "bf16 autocast", "fp16 autocast"])
@pytest.mark.parametrize("kind", ops.FAMILY_CLASS_TERMS)
def test_the_class_terms_op_is_the_families_operations_on_the_cpu(library, kind, region):
    """torch.ops.lucid.detr_cost.class_terms: every layer's class terms in one call, bit for bit the families' own
    operations (ops.family_class_terms_reference, on the objects' classes padded per image with class 0) on the CPU,
    whose vectorised math rounds an element by its place: widths that are no multiple of a vector, a stack's strided
    layers, bf16 logits and autocast regions, gammas with and without a special-cased power, images without
    objects."""
    dtype, autocast = {"float32": (torch.float32, None), "bf16 logits": (torch.bfloat16, None),
                       "bf16 autocast": (torch.float32, torch.bfloat16),
                       "fp16 autocast": (torch.float32, torch.float16)}[region]
    g = torch.Generator().manual_seed(ops.FAMILY_CLASS_TERMS.index(kind))
    for layers, counts, nq, nc, width, gamma in [(1, [3], 5, 7, 3, 2.0), (3, [6, 0], 37, 91, 6, 2.0),
                                                 (2, [4, 11, 1], 300, 80, 11, 1.5), (6, [1, 1], 17, 2, 1, 2.0)]:
        bs = len(counts)
        stack = (torch.randn(bs, layers, nq, nc, generator=g) * 4).to(dtype)
        logits = stack.transpose(0, 1)  # (L, B, Q, C) of a (B, L, Q, C) stack, as RT-DETR's
        labels = torch.randint(0, nc, (sum(counts),), generator=g)
        padded = torch.zeros(bs, width, dtype=torch.long)
        for b, part in enumerate(labels.split(counts)):
            padded[b, : len(part)] = part
        sizes = torch.tensor(counts)
        with _region("cpu", autocast):
            theirs = ops.family_class_terms_reference(logits, padded, kind, 0.25, gamma, sizes)
            ours = ops.family_class_terms(logits, labels, sizes, width, kind, 0.25, gamma)
        assert ours.dtype == theirs.dtype and ours.shape == (layers, bs, nq, width)
        bits = torch.int32 if ours.dtype == torch.float32 else torch.int16
        assert torch.equal(ours.view(bits), theirs.view(bits)), (kind, region)
    logits, labels = torch.zeros(1, 2, 3, 4), torch.zeros(3, dtype=torch.long)
    for args, error, words in [((labels, torch.tensor([1, 2, 0]), 2), ValueError, r"sizes must be \(B,\) with B = 2"),
                               ((labels, torch.tensor([1, 2]), 1), ValueError, r"sizes must be in \[0, width = 1\]"),
                               ((labels, torch.tensor([1, 1]), 2), ValueError, "add up to labels' 3 objects"),
                               ((labels.int(), torch.tensor([1, 2]), 2), TypeError, "labels must be int64")]:
        with pytest.raises(error, match=words):
            ops.family_class_terms(logits, *args, kind)
    with pytest.raises(ValueError, match="logits: family_class_terms runs on the CPU, got a tensor on meta"):
        ops.family_class_terms(logits.to("meta"), labels, torch.tensor([1, 2]), 2, kind)
    with pytest.raises(ValueError, match=r"logits must be \(L, B, Q, C\) with L >= 1"):
        ops.family_class_terms(torch.zeros(0, 2, 3, 4), labels, torch.tensor([1, 2]), 2, kind)
    grad = torch.randn(2, 2, 5, 6, requires_grad=True)  # the op's result is a constant: no graph behind it
    assert not ops.family_class_terms(grad, torch.randint(0, 6, (4,)), torch.tensor([3, 1]), 3, kind).requires_grad
    torch.library.opcheck(torch.ops.lucid.detr_cost.class_terms,
                          (torch.randn(2, 2, 5, 6), torch.randint(0, 6, (4,)), torch.tensor([3, 1]), 3,
                           ops.FAMILY_CLASS_TERMS.index(kind), 0.25, 2.0))


def test_the_class_term_of_probabilities_needs_no_math_function(library):
    """DETR's class term computed in the op from the softmax's probabilities (minus the object's): the same as the
    family's, on the CPU too."""
    fam, m = FAMILIES["softmax"], Matcher()
    logits, boxes, labels, objects, counts = _batch("cpu", seed=4)
    where = core.layout(counts, logits.shape[2], 1, "cpu")
    plan = _plan(fam, logits, boxes, objects)
    theirs, _ = _theirs(m, fam, logits, boxes, labels, objects, where)
    ours, _ = _ours(m, fam, logits, boxes, labels, objects, where, plan, class_term=False)
    assert _same(ours, theirs, where)


@pytest.mark.cuda
@pytest.mark.parametrize("region", ["float32", "bf16 autocast", "fp16 autocast"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_op_computes_the_family_cost_bit_for_bit_on_cuda(library, family, region):
    """On CUDA the op computes the class term too (CUDA's exp and log, as ATen's CUDA kernels): every entry equals the
    family's own operations', with and without the class term given."""
    fam, m = FAMILIES[family], Matcher()
    dtype, autocast = REGIONS.get(region, (torch.float16, torch.float16))
    for seed in range(3):
        logits, boxes, labels, objects, counts = _batch("cuda", seed=seed, dtype=dtype, queries=40, classes=80)
        for groups in (1, 2):
            where = core.layout(counts, logits.shape[2], groups, "cuda")
            with _region("cuda", autocast):
                plan = _plan(fam, logits, boxes, objects)
                theirs, _ = _theirs(m, fam, logits, boxes, labels, objects, where)
                for given in (True, False):
                    ours, invalid = _ours(m, fam, logits, boxes, labels, objects, where, plan, class_term=given)
                    assert int(invalid) == 0 and _same(ours, theirs, where), (seed, groups, given)


@pytest.mark.parametrize("device", devices())
def test_sanitising_the_corner_check_and_classes_out_of_range(library, device):
    """NaN and infinite costs become float32's largest value with sanitize and stay without; a query or an object
    whose corners are not x2 >= x1, y2 >= y1 (a negative width, NaN) sets invalid, as the family raises; an object's
    class outside [0, C) makes its column NaN."""
    fam, m = FAMILIES["focal"], Matcher()
    logits, boxes, labels, objects, counts = _batch(device)
    where = core.layout(counts, logits.shape[2], 1, device)
    plan = _plan(fam, logits, boxes, objects)
    ours, invalid = _ours(m, fam, logits, boxes, labels, objects, where, plan, class_term=False)
    assert int(invalid) == 0 and torch.isfinite(ours).all()
    nan = boxes.clone()
    nan[1, 2, 4] = float("nan")
    for sanitize in (True, False):
        ours, invalid = _ours(m, fam, logits, nan, labels, objects, where, plan, sanitize=sanitize, class_term=False)
        row = ours[1 * 3 + 2, 4, :3]
        assert int(invalid) == 1
        assert (torch.all(row == torch.finfo(torch.float32).max) if sanitize else torch.all(row.isnan()))
    flipped = objects.clone()
    flipped[4, 2] = -0.1
    _, invalid = _ours(m, fam, logits, boxes, labels, flipped, where, plan, class_term=False)
    assert int(invalid) == 1
    wrong = labels.clone()
    wrong[1] = logits.shape[-1]
    ours, _ = _ours(m, fam, logits, boxes, wrong, objects, where, plan, class_term=False)
    assert ours[::3, :, 1].isnan().all() and not ours[::3, :, 0].isnan().any()


def test_bad_arguments_are_refused(library):
    fam = FAMILIES["focal"]
    logits, boxes, labels, objects, counts = _batch("cpu")
    plan = _plan(fam, logits, boxes, objects)
    codes = [ops.DTYPE_CODES[plan[k]] for k in ops.FAMILY_DTYPES]
    sizes = torch.tensor(counts)
    op = torch.ops.lucid.detr_cost.family

    def call(**change):
        args = dict(scores=logits, boxes=boxes, labels=labels, objects=objects, sizes=sizes, width=6, groups=1,
                    gains=[2.0, 5.0, 2.0], class_term=1, alpha=0.25, gamma=2.0, l1_order=0, dtypes=codes,
                    sanitize=True, top=3.0e38) | change
        return op(*args.values())

    for change, words in [(dict(scores=logits[0]), "scores must be (L, B, Q, C)"),
                          (dict(boxes=boxes[..., :3]), "boxes must be (L, B, Q, 4)"),
                          (dict(objects=objects[:, :2]), "objects must be (N, 4)"),
                          (dict(labels=labels[:-1]), "labels must be (N,)"),
                          (dict(sizes=torch.tensor([3, 0, 5])), "sizes must add up to N"),
                          (dict(sizes=torch.tensor([3, 0, 6]), width=5), "sizes[2] must be in [0, width]"),
                          (dict(groups=3), "groups must be >= 1 and divide the queries"),
                          (dict(class_term=3), "class_term must be 0"),
                          (dict(dtypes=codes[:8]), "dtypes must be 9 codes"),
                          (dict(dtypes=codes[:8] + [7]), "dtypes must be codes"),
                          (dict(gamma=-1.0), "gamma must be a finite number >= 0"),
                          (dict(scores=logits.double()), "scores, boxes and objects must be float16")]:
        with pytest.raises((ValueError, TypeError), match=words.replace("(", r"\(").replace(")", r"\)")
                           .replace("[", r"\[").replace("]", r"\]")):
            call(**change)
    cost, invalid = call()
    assert cost.shape == (9, 8, 6) and invalid.shape == (1,) and invalid.dtype == torch.int32


@pytest.mark.parametrize("device", devices())
def test_opcheck(library, device):
    fam = FAMILIES["softmax"]
    logits, boxes, labels, objects, counts = _batch(device)
    plan = _plan(fam, logits, boxes, objects)
    codes = [ops.DTYPE_CODES[plan[k]] for k in ops.FAMILY_DTYPES]
    sizes = torch.tensor(counts, device=device)
    for groups, class_cost in ((1, None), (2, torch.rand(3, 3, 8, 6, device=device))):
        args = (logits.softmax(-1), boxes, labels, objects, sizes, 6, groups, [1.0, 5.0, 2.0], 0, 0.25, 2.0, 0,
                codes, True, 3.0e38, class_cost)
        torch.library.opcheck(torch.ops.lucid.detr_cost.family, args)


PARTS_REGIONS = {"float32": None, "bf16 autocast": torch.bfloat16, "fp16 autocast": torch.float16}


def _parts(device, dtypes, layers, **batch):
    """Parts of one loss call: a stack of each of ``layers`` layers in each of ``dtypes``, against the same objects
    (the first part's); the second part a layer-major view of a (B, L, Q, .) stack (strided), as decoders give."""
    logits, boxes, labels, objects, counts = _batch(device, layers=sum(layers), **batch)
    parts, first = [], 0
    for k, (dtype, n) in enumerate(zip(dtypes, layers)):
        lg, bx = logits[first:first + n].to(dtype), boxes[first:first + n].to(dtype)
        if k == 1:  # the same values, stored (B, L, Q, .)
            lg, bx = lg.transpose(0, 1).contiguous().transpose(0, 1), bx.transpose(0, 1).contiguous().transpose(0, 1)
        parts.append((lg, bx))
        first += n
    return parts, labels, objects, counts


@pytest.mark.parametrize("region", list(PARTS_REGIONS))
@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("device", devices())
def test_the_parts_op_is_each_parts_family_cost(library, device, family, region):
    """torch.ops.lucid.detr_cost.parts: the parts of a loss call of their own dtypes and strides (a float32 stack of
    three layers, a strided one of two and an output of one layer, both in the autocast region's dtype) in one call,
    each part's class term computed from its logits: every entry of every part's problems equals the family's own
    operations' on that part, part after part, bit for bit, with 1 and 2 query groups; the corner check covers every
    part, and a class outside [0, C) costs NaN."""
    fam, m = FAMILIES[family], Matcher()
    autocast = PARTS_REGIONS[region]
    low = autocast or torch.float32
    for seed in range(2):
        parts, labels, objects, counts = _parts(device, (torch.float32, low, low), (3, 2, 1), seed=seed)
        for groups in (1, 2):
            where = core.layout(counts, parts[0][0].shape[2], groups, device)
            with _region(device, autocast):
                lt._plans.clear()
                plans = [lt._dtype_plan(m, fam, ("test", k), lg, bx, objects) for k, (lg, bx) in enumerate(parts)]
                assert all(plan is not None for plan in plans)
                theirs = torch.cat([_theirs(m, fam, lg, bx, labels, objects, where)[0] for lg, bx in parts])
                ours, invalid = ops.detr_family_parts_cost(
                    [lg for lg, _ in parts], [bx for _, bx in parts], labels, objects, where.image_sizes, where.width,
                    groups, (m.class_cost, m.bbox_cost, m.giou_cost), class_term=fam.class_term, alpha=fam.alpha,
                    gamma=fam.gamma, l1_order=0 if device == "cpu" else 1, dtypes=plans)
            assert int(invalid) == 0 and _same(ours, theirs, where), (seed, groups)
    flipped = [(lg, bx.clone()) for lg, bx in parts]
    flipped[2][1][0, 1, 2, 2] = -0.1  # a negative width in the last part only
    wrong = labels.clone()
    wrong[0] = parts[0][0].shape[-1]  # a class outside [0, C): its column NaN, never read
    with _region(device, autocast):
        lt._plans.clear()
        plans = [lt._dtype_plan(m, fam, ("test", k), lg, bx, objects) for k, (lg, bx) in enumerate(parts)]
        ours, invalid = ops.detr_family_parts_cost([lg for lg, _ in flipped], [bx for _, bx in flipped], wrong,
                                                   objects, where.image_sizes, where.width, 1, (2, 5, 2),
                                                   class_term=fam.class_term, dtypes=plans)
    assert int(invalid) == 1
    assert ours[::3, :, 0].isnan().all() and not ours[::3, :, 1].isnan().any()


def test_bad_parts_are_refused(library):
    fam = FAMILIES["focal"]
    parts, labels, objects, counts = _parts("cpu", (torch.float32, torch.float32), (3, 1))
    plan = _plan(fam, *parts[0], objects)
    codes = [ops.DTYPE_CODES[plan[k]] for k in ops.FAMILY_DTYPES] * 2
    scores, boxes = [lg for lg, _ in parts], [bx for _, bx in parts]
    op = torch.ops.lucid.detr_cost.parts

    def call(**change):
        args = dict(scores=scores, boxes=boxes, labels=labels, objects=objects, sizes=torch.tensor(counts), width=6,
                    groups=1, gains=[2.0, 5.0, 2.0], class_kind=1, alpha=0.25, gamma=2.0, l1_order=0, dtypes=codes,
                    sanitize=True, top=3.0e38) | change
        return op(*args.values())

    for change, words in [(dict(scores=[], boxes=[]), "scores must hold at least one part"),
                          (dict(boxes=boxes[:1]), "boxes must hold one (L, B, Q, 4) stack per part of scores (2)"),
                          (dict(dtypes=codes[:9]), "dtypes must be 9 codes per part (18 for 2 parts)"),
                          (dict(class_kind=5), "class_kind must be 0 (softmax), 1 (focal), 2"),
                          (dict(scores=[scores[0], scores[1][0, 0]]), "scores[1] must be (L, B, Q, C) or (B, Q, C)"),
                          (dict(scores=[scores[0], scores[1][:, :2]]), "scores[1] must have the images and queries"),
                          (dict(boxes=[boxes[0], boxes[1][..., :3]]), "boxes must be (L, B, Q, 4)"),
                          (dict(dtypes=codes[:17] + [5]), "dtypes must be codes")]:
        with pytest.raises((ValueError, TypeError), match=re.escape(words)):
            call(**change)
    cost, invalid = call()
    assert cost.shape == (12, 8, 6) and invalid.shape == (1,) and invalid.dtype == torch.int32
    one_layer = dict(scores=[scores[0], scores[1][0]], boxes=[boxes[0], boxes[1][0]])  # a part of one layer, 3-D
    assert all(torch.equal(a, b) for a, b in zip(call(**one_layer), (cost, invalid)))
    grad = [scores[0].clone().requires_grad_(), scores[1]]
    assert not any(t.requires_grad for t in call(scores=grad, class_kind=0))  # constants, no graph behind them
    for parts_args in (dict(scores=scores, boxes=boxes), one_layer):
        torch.library.opcheck(op, tuple(dict(**parts_args, labels=labels, objects=objects,
                                             sizes=torch.tensor(counts), width=6, groups=2, gains=[2.0, 5.0, 2.0],
                                             class_kind=0, alpha=0.25, gamma=2.0, l1_order=0, dtypes=codes,
                                             sanitize=True, top=3.0e38).values()))


def test_a_cost_one_unit_in_the_last_place_off_fails_the_guard(library, monkeypatch):
    """The patched matcher's first call of a kind compares the op's cost with the family's own entry by entry: one
    entry nudged by one unit in the last place fails it (the kind keeps the family's cost, said once), and the
    matches stay the family's; unnudged, it passes."""
    from transformers.loss.loss_for_object_detection import HungarianMatcher

    logits, boxes, labels, objects, counts = _batch("cpu", layers=1)
    outputs = {"logits": logits[0], "pred_boxes": boxes[0]}
    starts = [0, 3, 3]
    targets = [{"class_labels": labels[s:s + n], "boxes": objects[s:s + n]} for s, n in zip(starts, counts)]
    own = [(i.clone(), j.clone()) for i, j in HungarianMatcher(2, 5, 2)(outputs, targets)]
    for nudge in (False, True):
        for name in ("detr_family_cost", "detr_family_parts_cost"):  # the op of one stack, and of several parts
            monkeypatch.setattr(lt.ops, name, one_ulp_off(getattr(ops, name), nudge))
        lt._verified.clear(), lt._blocks_ok.clear(), lt._plans.clear()
        said = pytest.warns(FallbackWarning, match="computes its cost otherwise") if nudge else contextlib.nullcontext()
        with lt.patched("kernel"), said:
            ours = HungarianMatcher(2, 5, 2)(outputs, targets)
        assert list(lt._blocks_ok.values()) == [not nudge]
        assert all(torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(ours, own))
    lt._verified.clear(), lt._blocks_ok.clear(), lt._plans.clear()


def test_the_targets_objects_are_kept_while_unchanged(library):
    """A loss's matcher calls share the batch's labels and boxes (one torch.cat each), kept while the targets'
    tensors are the same and unchanged: a change in place, or other tensors, makes them again."""
    _, _, labels, objects, counts = _batch("cpu")
    starts = [0, 3, 3]
    targets = [{"class_labels": labels[s:s + n].clone(), "boxes": objects[s:s + n].clone()}
               for s, n in zip(starts, counts)]
    first = lt._objects_of(targets)
    assert torch.equal(first[0], labels) and torch.equal(first[1], objects)
    assert lt._objects_of(targets)[1] is first[1]
    targets[2]["boxes"][0, 0] += 1  # in place
    again = lt._objects_of(targets)
    assert again[1] is not first[1] and again[1][3, 0] == objects[3, 0] + 1
    other = [dict(t) for t in targets]
    other[0] = {"class_labels": other[0]["class_labels"].clone(), "boxes": other[0]["boxes"].clone()}
    assert lt._objects_of(other)[1] is not again[1]
