"""transformers' DETR-family matchers patched (lucid_assign.integrations.transformers): each model family built from a
tiny config (no weights, no downloads), one training loss call unpatched and one patched, the same matches and the
same loss and gradients, bit for bit; the grouped matching of LW-DETR and RF-DETR against SciPy's per-group loop."""

import contextlib
import re
from typing import Callable, NamedTuple

import numpy as np
import pytest
import torch

tf = pytest.importorskip("transformers")
pytest.importorskip("scipy")
from scipy.optimize import linear_sum_assignment  # noqa: E402

from lucid_assign import FallbackWarning  # noqa: E402
from lucid_assign.integrations import _matching as core, transformers as lt  # noqa: E402


@pytest.fixture(autouse=True)
def restored():
    lt._verified.clear()  # each test sees the classes' first call (the checks are once per process)
    lt._blocks_ok.clear()
    yield
    lt.unpatch()


def _resnet():
    return tf.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16, 16, 16], depths=[1, 1, 1, 1], layer_type="basic",
                           out_features=["stage2", "stage3", "stage4"])


def _detr_like(config_cls, model_cls, decoder_layers=2, **more):
    config = config_cls(use_timm_backbone=False, backbone_config=_resnet(), use_pretrained_backbone=False,
                        encoder_layers=1, decoder_layers=decoder_layers, encoder_attention_heads=2,
                        decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16, num_queries=12, num_labels=4,
                        auxiliary_loss=True, **more)
    return model_cls(config)


def _lw_detr(decoder_layers=2):
    backbone = tf.LwDetrViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=64,
                                  pretrain_image_size=64, patch_size=16, window_block_indices=[0], num_windows=4,
                                  out_indices=[1, 2])
    return tf.LwDetrForObjectDetection(tf.LwDetrConfig(
        backbone_config=backbone, projector_scale_factors=[1.0], d_model=32, num_queries=12, group_detr=3,
        decoder_layers=decoder_layers, decoder_self_attention_heads=2, decoder_cross_attention_heads=2,
        decoder_ffn_dim=32, decoder_n_points=2, num_labels=4))


def _rf_detr(model_cls):
    backbone = tf.RfDetrDinov2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=56,
                                     patch_size=14, num_windows=2, out_indices=[1, 2])
    return model_cls(tf.RfDetrConfig(
        backbone_config=backbone, d_model=32, num_queries=12, group_detr=3, decoder_layers=2,
        decoder_self_attention_heads=2, decoder_cross_attention_heads=2, decoder_ffn_dim=32, decoder_n_points=2,
        num_labels=4))


def _grounding_dino():
    text = tf.BertConfig(vocab_size=1030, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=16, max_position_embeddings=32)  # its separators are token ids up to 1029
    return tf.GroundingDinoForObjectDetection(tf.GroundingDinoConfig(
        backbone_config=_resnet(), use_timm_backbone=False, use_pretrained_backbone=False, text_config=text,
        d_model=32, num_queries=12, encoder_layers=1, decoder_layers=2, encoder_ffn_dim=16, decoder_ffn_dim=16,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_n_points=2, decoder_n_points=2,
        max_text_len=16, num_feature_levels=3, auxiliary_loss=True))


class Family(NamedTuple):
    make: Callable
    matcher: str
    size: int = 64  # the images' side
    masks: bool = False  # the labels hold masks (RF-DETR's segmentation)
    text: bool = False  # the model takes a prompt (Grounding DINO: three phrases, one per class label used)


FAMILIES = {
    "DETR": Family(lambda: _detr_like(tf.DetrConfig, tf.DetrForObjectDetection, d_model=16), "HungarianMatcher"),
    "Conditional DETR": Family(lambda: _detr_like(tf.ConditionalDetrConfig, tf.ConditionalDetrForObjectDetection,
                                                  d_model=16), "DeformableDetrHungarianMatcher"),
    "Deformable DETR": Family(lambda: _detr_like(tf.DeformableDetrConfig, tf.DeformableDetrForObjectDetection,
                                                 d_model=32, encoder_n_points=2, decoder_n_points=2),
                              "DeformableDetrHungarianMatcher"),
    "RT-DETR": Family(lambda: tf.RTDetrForObjectDetection(tf.RTDetrConfig(
        num_labels=4, num_queries=12, d_model=32, encoder_hidden_dim=32, decoder_in_channels=[32, 32, 32],
        decoder_layers=2, encoder_layers=1, decoder_ffn_dim=32, encoder_ffn_dim=32, num_denoising=4)),
        "RTDetrHungarianMatcher"),
    "D-FINE": Family(lambda: tf.DFineForObjectDetection(tf.DFineConfig(
        num_labels=4, num_queries=12, d_model=32, encoder_hidden_dim=32, decoder_in_channels=[32, 32, 32],
        decoder_layers=2, encoder_ffn_dim=32, decoder_ffn_dim=32, num_denoising=4)), "RTDetrHungarianMatcher"),
    "LW-DETR": Family(_lw_detr, "LwDetrHungarianMatcher"),
    "RF-DETR": Family(lambda: _rf_detr(tf.RfDetrForObjectDetection), "LwDetrHungarianMatcher", size=56),
    "RF-DETR segmentation": Family(lambda: _rf_detr(tf.RfDetrForInstanceSegmentation), "RfDetrHungarianMatcher",
                                   size=56, masks=True),
    "Grounding DINO": Family(_grounding_dino, "GroundingDinoHungarianMatcher", text=True),
}


def _labels(counts, seed=0, duplicate=True, masks=0):
    """Targets as the image processors give them (normalised cx cy w h), with an image without objects and two
    identical objects (their columns tie: only SciPy's tie rules settle them); with masks of side ``masks``."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for k in counts:
        xy = 0.2 + 0.6 * torch.rand(k, 2, generator=g)
        wh = 0.05 + 0.3 * torch.rand(k, 2, generator=g)
        boxes, cls = torch.cat([xy, wh], 1), torch.randint(0, 4 if not masks else 3, (k,), generator=g)
        target = {"class_labels": cls, "boxes": boxes}
        if masks:
            target["masks"] = (torch.rand(k, masks, masks, generator=g) > 0.5).float()
        if duplicate and k >= 2:
            boxes[1], cls[1] = boxes[0], cls[0]
            if masks:
                target["masks"][1] = target["masks"][0]
        out.append(target)
    return out


def _loss(model, inputs, labels):
    torch.manual_seed(1)  # dropout, the denoising queries and the mask points draw the same numbers in both runs
    model.zero_grad(set_to_none=True)
    out = model(**inputs, labels=labels)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.loss.detach(), {k: v.detach() for k, v in out.loss_dict.items()}, grads


CASES = {  # the objects per image (12 queries; an image without objects, duplicated objects in the others) and autocast
    "float32": ([3, 0, 6], None),
    "more objects than queries": ([3, 0, 14], None),
    "no objects": ([0, 0, 0], None),
    "one image with none": ([0], None),
    "bf16 autocast": ([3, 0, 6], torch.bfloat16),
    "fp16 autocast": ([3, 0, 6], torch.float16),
}
BLOCKS = {name for name, spec in lt.MATCHERS.items() if spec.block}  # whose cost is computed per image block


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_family_gives_the_same_loss_patched(library, family, case, device, monkeypatch):
    """The CPU: the loss, its parts and the gradients, bit for bit (where the family itself refuses the batch, the
    same error). CUDA: every call's matches against the matcher's
    own on that call's inputs (the losses themselves are not reproducible there: DETR's class loss differs between two
    unpatched runs by a unit in the last place, and the deformable attention's backward adds with atomics). The
    matchers whose cost is computed per image block here do so, their blocks checked against their own cost."""
    spec = FAMILIES[family]
    counts, region = CASES[case]
    if region == torch.float16 and device == "cpu":
        pytest.skip("float16 autocast is CUDA's")
    torch.manual_seed(0)
    model = spec.make().to(device)
    model.train()
    g = torch.Generator().manual_seed(2)
    images = len(counts)
    inputs = {"pixel_values": torch.rand(images, 3, spec.size, spec.size, generator=g).to(device)}
    if spec.text:  # [CLS] a . b . c . [SEP]: three phrases, the class labels 0-2
        inputs["input_ids"] = torch.tensor([[101, 5, 1012, 7, 1012, 9, 1012, 102]] * images, device=device)
    labels = [{k: v.to(device) for k, v in t.items()} for t in _labels(counts, masks=spec.size if spec.masks else 0)]
    if spec.text:
        labels = [dict(t, class_labels=t["class_labels"] % 3) for t in labels]
    autocast = (lambda: torch.autocast(device, dtype=region)) if region else contextlib.nullcontext
    try:
        with autocast():
            plain = _loss(model, inputs, labels)
    except Exception as e:  # the family's own refusal (a batch norm over one image, say): patched, the same error
        with lt.patched("kernel"), autocast(), pytest.raises(type(e), match=re.escape(str(e))):
            _loss(model, inputs, labels)
        return
    with lt.patched("kernel"):
        assert f"{spec.matcher}: patched" in lt.patch_report()
        cls = next(c for c in lt.STATE.originals if c.__name__ == spec.matcher)
        with _each_call_compared(cls) as calls, autocast():
            ours = _loss(model, inputs, labels)
            again = _loss(model, inputs, labels)  # after the first call's check: the layers matched at once
        assert calls and all(calls)  # every call's matches were the matcher's own on that call's inputs
        assert lt._verified.get(cls) is True  # its first call matched as the matcher's own
        blocks = [ok for kind, ok in lt._blocks_ok.items() if kind[0] is cls]  # one a kind (dtypes, autocast)
        # its blocks are its cost (a batch without objects has none: its matches are empty, the op not called)
        assert (blocks and all(blocks)) if spec.matcher in BLOCKS and sum(counts) else not blocks, blocks
    if device == "cuda":
        return
    for run in (ours, again):
        assert torch.equal(plain[0], run[0]), (plain[0], run[0])
        assert plain[1].keys() == run[1].keys() and all(torch.equal(plain[1][k], run[1][k]) for k in plain[1])
        assert plain[2].keys() == run[2].keys() and all(torch.equal(plain[2][k], run[2][k]) for k in plain[2])


class _Largest(torch.utils._python_dispatch.TorchDispatchMode):
    """The most elements of any tensor an operation makes while it is on."""

    def __init__(self):
        super().__init__()
        self.most = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.most = max(self.most, t.numel())
        return out


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("family", [f for f, spec in FAMILIES.items() if spec.matcher in BLOCKS])
def test_no_patched_call_builds_the_batchs_cross_product(library, family, device):
    """A matcher whose cost is computed per image block never makes a tensor as large as the batch's cross product
    (every query of the batch against every object of the batch), as its own forward does: six images of six objects,
    each block a sixth of the cross product, the layers of a stack together well under one cross product."""
    spec = FAMILIES[family]
    torch.manual_seed(0)
    model = spec.make().to(device)
    model.train()
    g = torch.Generator().manual_seed(2)
    inputs = {"pixel_values": torch.rand(6, 3, spec.size, spec.size, generator=g).to(device)}
    labels = [{k: v.to(device) for k, v in t.items()} for t in _labels([6] * 6, duplicate=False)]
    with lt.patched("kernel"):
        cls = next(c for c in lt.STATE.originals if c.__name__ == spec.matcher)
        _loss(model, inputs, labels)  # the class's first call (and kind), checked against its own forward
        forward, sizes = cls.forward, []

        def measured(self, outputs, targets, *args, **kwargs):
            with _Largest() as largest:
                out = forward(self, outputs, targets, *args, **kwargs)
            sizes.append((largest.most, outputs["logits"].shape[:2].numel() * sum(len(t["boxes"]) for t in targets)))
            return out

        cls.forward = measured
        try:
            _loss(model, inputs, labels)
        finally:
            cls.forward = forward
    assert sizes and all(most < cross for most, cross in sizes), sizes


@contextlib.contextmanager
def _each_call_compared(cls):
    """Each call of the patched class also runs the matcher's own forward on the same inputs (SciPy on the host) and
    from the same state of the random generators (RF-DETR's mask cost draws points), leaving them where the patched
    call did; the list says for each call whether the two matched alike."""
    patched_forward, own, calls = cls.forward, lt.STATE.originals[cls], []

    def compared(self, outputs, targets, *args, **kwargs):
        devices = lt._cuda_devices(outputs)
        before = torch.get_rng_state(), [torch.cuda.get_rng_state(d) for d in devices]
        ours = patched_forward(self, outputs, targets, *args, **kwargs)
        with torch.random.fork_rng(devices=devices):
            torch.set_rng_state(before[0])
            for d, state in zip(devices, before[1]):
                torch.cuda.set_rng_state(state, d)
            calls.append(lt._same(ours, own(self, outputs, targets, *args, **kwargs)))
        return ours

    cls.forward = compared
    try:
        yield calls
    finally:
        cls.forward = patched_forward


def _count_solves(monkeypatch) -> list:
    """The layers of each call of the core's solve while the test runs (a list that grows)."""
    solves, solve = [], core.solve
    monkeypatch.setattr(core, "solve", lambda problems, where, backend, layers=1: solves.append(layers)
                        or solve(problems, where, backend, layers))
    return solves


def _a_later_loss_call(model, spec, region, *counters) -> list:
    """A loss call of ``model`` (in training, on three images) after the matcher class's first, checked one, with
    ``counters`` emptied in between: whether each of its matcher calls matched as the matcher's own."""
    model.train()
    inputs = {"pixel_values": torch.rand(3, 3, spec.size, spec.size, generator=torch.Generator().manual_seed(2))}
    labels = _labels([3, 0, 6])
    autocast = (lambda: torch.autocast("cpu", dtype=region)) if region else contextlib.nullcontext
    with lt.patched("kernel"), autocast():
        cls = next(c for c in lt.STATE.originals if c.__name__ == spec.matcher)
        _loss(model, inputs, labels)  # the class's first call, checked
        for counter in counters:
            counter.clear()
        with _each_call_compared(cls) as calls:
            _loss(model, inputs, labels)
    return calls


@pytest.mark.parametrize("region", [None, torch.bfloat16], ids=["float32", "bf16 autocast"])
@pytest.mark.parametrize("family", ["DETR", "Deformable DETR", "RT-DETR", "LW-DETR"])
def test_the_layers_of_a_loss_call_are_matched_in_one_solve(library, family, region, monkeypatch):
    """Every matcher call of one loss call shares one call of the op (after the class's first call, which is checked
    on its own): the decoder's layers, the last layer where it is not a view of their stack and the encoder's outputs
    (RT-DETR's proposals, LW-DETR's); each call's matches the matcher's own (LW-DETR: in query groups); a call served
    from the loss call's solve reads nothing else of its call (not its kind, nor its layout: the same targets give it).
    Under bf16 autocast RT-DETR's and LW-DETR's encoder boxes are bf16 and the decoder's float32: costed apart, solved
    together."""
    solves, kinds, layouts = _count_solves(monkeypatch), [], []
    usable, layout = lt._blocks_usable, core.layout
    monkeypatch.setattr(lt, "_blocks_usable", lambda *a: kinds.append(1) or usable(*a))
    monkeypatch.setattr(core, "layout", lambda *a: layouts.append(1) or layout(*a))
    spec = FAMILIES[family]
    torch.manual_seed(0)
    # DETR and LW-DETR match their last layer apart from the others (not a view of their stack): three layers, so
    # that two calls are of a stack
    model = {"DETR": lambda: _detr_like(tf.DetrConfig, tf.DetrForObjectDetection, 3, d_model=16),
             "LW-DETR": lambda: _lw_detr(3)}.get(family, spec.make)()
    calls = _a_later_loss_call(model, spec, region, solves, kinds, layouts)
    assert all(calls) and len(solves) == 1 and solves[0] >= len(calls), (solves, calls)
    assert len(kinds) == len(solves) == len(layouts), (kinds, solves, layouts)


def test_a_part_the_op_does_not_cost_is_costed_by_its_dtype_and_joined(library, monkeypatch):
    """Under bf16 autocast RT-DETR's encoder boxes are bf16 and the decoder's float32; where the op does not cost the
    bf16 part (no dtype plan for it), that part is costed by the family's operations and the decoder's by the op, one
    call for each run of one dtype (core.by_dtypes), still in one solve, each call's matches the matcher's own."""
    solves, parts_calls = _count_solves(monkeypatch), []
    parts_cost = lt.ops.detr_family_parts_cost
    monkeypatch.setattr(lt.ops, "detr_family_parts_cost", lambda scores, *a, **k: parts_calls.append(len(scores))
                        or parts_cost(scores, *a, **k))
    plan = lt._dtype_plan
    monkeypatch.setattr(lt, "_dtype_plan", lambda m, fam, kind, logits, boxes, objects: None
                        if boxes.dtype == torch.bfloat16 else plan(m, fam, kind, logits, boxes, objects))
    spec = FAMILIES["RT-DETR"]
    torch.manual_seed(0)
    lt._plans.clear()
    calls = _a_later_loss_call(spec.make(), spec, torch.bfloat16, solves, parts_calls)
    lt._plans.clear()
    assert all(calls) and len(solves) == 1 and solves[0] >= len(calls), (solves, calls)
    assert parts_calls == [1], parts_calls  # the float32 decoder's run alone by the op


def test_layer_matches_follow_their_inputs(library):
    """A layer's matches are served from its stack's first call only while the stack, the objects and the view are
    what they were: after an in-place change, with other objects, or on another slice, the call matches afresh."""
    cls = lt._classes()["RTDetrHungarianMatcher"]
    matcher = cls(tf.RTDetrConfig(num_labels=4))
    own = vars(cls)["forward"]
    g = torch.Generator().manual_seed(3)
    logits, boxes = torch.randn(2, 3, 10, 4, generator=g), 0.2 + 0.6 * torch.rand(2, 3, 10, 4, generator=g)
    targets = _labels([3, 2], seed=1)

    def layer(k, queries=slice(0, 8)):  # (B, L, Q, C) stacks, the loss's views of layer k
        return {"logits": logits[:, k, queries], "pred_boxes": boxes[:, k, queries]}

    with lt.patched("kernel"):
        matcher(layer(2), targets)  # the class's first call, checked
        for k in (2, 0, 1):  # 2 matches all three layers at once; 0 and 1 are served
            assert lt._same(matcher(layer(k), targets), own(matcher, layer(k), targets))
        assert core._MEMOS.get(matcher) and not any(memo._layers for memo in core._MEMOS[matcher].memos)
        matcher(layer(2), targets)  # a new pass over the stack: all its layers again
        logits[:, 1] = logits[:, 1].flip(1)  # in place: layer 1's served matches would be stale
        assert lt._same(matcher(layer(1), targets), own(matcher, layer(1), targets))
        matcher(layer(2), targets)
        other = _labels([2, 3], seed=4)
        assert lt._same(matcher(layer(0), other), own(matcher, layer(0), other))
        matcher(layer(2), targets)
        assert lt._same(matcher(layer(0, slice(2, 10)), targets), own(matcher, layer(0, slice(2, 10)), targets))
        # LW-DETR's query groups: a call with other groups than the stack's first call matches afresh
        grouped = lt._classes()["LwDetrHungarianMatcher"]
        lw, lw_own = grouped(class_cost=2, bbox_cost=5, giou_cost=2), lt.STATE.originals[grouped]
        lw(layer(2), targets, 2)  # the class's first call, checked
        lw(layer(2), targets, 2)
        assert lt._same(lw(layer(1), targets, 4), lw_own(lw, layer(1), targets, 4))
        lw(layer(2), targets, group_detr=2)
        assert lt._same(lw(layer(0), targets, group_detr=2), lw_own(lw, layer(0), targets, 2))


def test_inference_mode_tensors_are_matched_alone(library):
    """Outputs and targets made under torch.inference_mode track no version counter: the layers' calls on them are
    matched on their own, the matcher's own matches, never an error of the layer memo."""
    cls = lt._classes()["RTDetrHungarianMatcher"]
    matcher = cls(tf.RTDetrConfig(num_labels=4))
    own = vars(cls)["forward"]
    g = torch.Generator().manual_seed(3)
    with torch.inference_mode():
        logits, boxes = torch.randn(2, 3, 10, 4, generator=g), 0.2 + 0.6 * torch.rand(2, 3, 10, 4, generator=g)
        targets = _labels([3, 2], seed=1)
    with lt.patched("kernel"):
        matcher({"logits": logits[:, 2], "pred_boxes": boxes[:, 2]}, targets)  # the class's first call, checked
        for k in (2, 0, 1):
            layer = {"logits": logits[:, k], "pred_boxes": boxes[:, k]}
            assert lt._same(matcher(layer, targets), own(matcher, layer, targets))


def _scipy_groups(cost, sizes, groups):
    """What LW-DETR's and RF-DETR's matchers do with their cost on the host: SciPy per image and query group."""
    per_group = cost.shape[1] // groups
    found = None
    for g, block in enumerate(cost.split(per_group, dim=1)[:groups]):
        each = [linear_sum_assignment(c[i]) for i, c in enumerate(block.split(sizes, -1))]
        found = each if g == 0 else [(np.concatenate([a[0], b[0] + per_group * g]), np.concatenate([a[1], b[1]]))
                                     for a, b in zip(found, each)]
    return [(torch.as_tensor(i, dtype=torch.int64), torch.as_tensor(j, dtype=torch.int64)) for i, j in found]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("backend", ["kernel", "reference"])
def test_grouped_matching_equals_scipy_per_group(library, device, backend):
    g = torch.Generator().manual_seed(0)
    for trial in range(150):
        bs, groups = int(torch.randint(1, 5, (1,), generator=g)), int(torch.randint(1, 4, (1,), generator=g))
        nq = groups * int(torch.randint(1, 8, (1,), generator=g)) + int(torch.randint(0, 2, (1,), generator=g))
        sizes = torch.randint(0, 10, (bs,), generator=g).tolist()
        cost = torch.randint(0, 4, (bs, nq, sum(sizes)), generator=g).float()  # ties everywhere
        if trial % 2:
            cost = torch.rand(bs, nq, sum(sizes), generator=g)
        got = lt.match(cost.to(device), sizes, groups, backend)
        assert lt._same(got, _scipy_groups(cost, sizes, groups)), (trial, sizes, groups)
        assert all(i.device.type == device for pair in got for i in pair)


def test_patch_report_unpatch_and_a_class_that_differs(library, monkeypatch):
    classes = {name: cls for name, cls in lt._classes().items() if cls is not None}
    own = {cls: vars(cls)["forward"] for cls in classes.values()}
    lt.patch()
    assert lt.is_patched() and len(lt.patch_report()) == len(lt.MATCHERS)
    assert all(vars(cls)["forward"] is not own[cls] for cls in classes.values())
    lt.unpatch()
    assert not lt.is_patched() and all(vars(cls)["forward"] is own[cls] for cls in classes.values())
    # a patched class whose first call differs from the matcher's own goes back to it, said once
    monkeypatch.setattr(core, "solve_call", lambda problems, where, *a, **k: [
        (torch.arange(min(n, where.queries) - 1, -1, -1), torch.arange(min(n, where.queries)))
        for n in where.counts])
    make, matcher = FAMILIES["DETR"][:2]
    torch.manual_seed(0)
    model = make()
    model.train()
    inputs, labels = {"pixel_values": torch.rand(2, 3, 64, 64)}, _labels([3, 4])
    plain = _loss(model, inputs, labels)
    with lt.patched():
        with pytest.warns(FallbackWarning, match=f"the patched {matcher} matched differently"):
            ours = _loss(model, inputs, labels)
        assert f"{matcher}: left to transformers (its first call matched differently)" in lt.patch_report()
    assert torch.equal(plain[0], ours[0])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("backend", ["kernel", "reference"])
def test_costs_scipy_refuses_raise_scipys_error(library, device, backend, monkeypatch):
    """transformers before 5.18 hands NaN and infinite costs to SciPy, which refuses them with a ValueError: a patched
    matcher of those versions raises the same error, where a matcher that replaces them (5.18 and later) never
    checks. The first problem SciPy's loop refuses gives the words: LW-DETR's loop runs over the groups, then the
    images."""
    cls = lt._classes()["DeformableDetrHungarianMatcher"]
    own = vars(cls)["forward"]
    def before_5_18(self, outputs, targets):  # SciPy sees the cost as the matcher computed it (replacing nothing)
        return own(self, outputs, targets)

    monkeypatch.setattr(cls, "forward", before_5_18)
    monkeypatch.setattr(torch, "nan_to_num", lambda t, **_: t)
    assert not lt._sanitizes(before_5_18)
    matcher = cls(class_cost=2, bbox_cost=5, giou_cost=2)
    g = torch.Generator().manual_seed(0)
    outputs = {"logits": torch.randn(2, 6, 4, generator=g).to(device),
               "pred_boxes": (0.25 + 0.5 * torch.rand(2, 6, 4, generator=g)).to(device)}
    targets = [{k: v.to(device) for k, v in t.items()} for t in _labels([2, 3], duplicate=False)]
    bad = dict(outputs, logits=outputs["logits"].clone())
    bad["logits"][1, 4, 0] = float("nan")
    with pytest.raises(ValueError, match="^matrix contains invalid numeric entries$"):
        matcher(bad, targets)  # transformers' own
    with lt.patched(backend):
        assert lt._same(matcher(outputs, targets), own(matcher, outputs, targets))  # the first call's check
        with pytest.raises(ValueError, match="^image 1: matrix contains invalid numeric entries$"):
            matcher(bad, targets)
        assert lt._same(matcher(outputs, targets), own(matcher, outputs, targets))
    # the order of SciPy's loop: image 0's group 1 is infeasible, image 1's group 0 holds NaN: the groups come first
    cost = torch.rand(2, 4, 5, generator=g)
    cost[0, 2:, :2] = float("inf")
    cost[1, 0, 3] = float("nan")
    with pytest.raises(ValueError, match="^matrix contains invalid numeric entries$"):
        _scipy_groups(cost, [2, 3], 2)
    with pytest.raises(ValueError, match="^image 1, query group 0: matrix contains invalid numeric entries$"):
        lt.match(cost.to(device), [2, 3], 2, backend, check=True)
    first = cost[:1, :, :2]  # image 0 alone: feasible as one group of four queries, not as two of two
    assert lt._same(lt.match(first.to(device), [2], 1, backend, check=True), _scipy_groups(first, [2], 1))
    with pytest.raises(ValueError, match="^cost matrix is infeasible$"):
        _scipy_groups(first, [2], 2)
    with pytest.raises(ValueError, match="^image 0, query group 1: cost matrix is infeasible$"):
        lt.match(first.to(device), [2], 2, backend, check=True)


def test_a_checked_call_leaves_the_random_generators_as_unpatched():
    """RF-DETR's mask cost draws random points: the check at the first call runs the matcher twice, and must neither
    see two different costs nor leave the generators elsewhere than an unpatched call does."""
    spec = FAMILIES["RF-DETR segmentation"]
    torch.manual_seed(0)
    model = spec.make()
    model.train()
    inputs = {"pixel_values": torch.rand(3, 3, spec.size, spec.size, generator=torch.Generator().manual_seed(2))}
    labels = _labels([3, 0, 6], masks=spec.size)
    _loss(model, inputs, labels)
    after_plain = torch.random.get_rng_state()
    with lt.patched("kernel"):
        _loss(model, inputs, labels)
        after_patched = torch.random.get_rng_state()
        cls = next(c for c in lt.STATE.originals if c.__name__ == spec.matcher)
        assert lt._verified.get(cls) is True
    assert torch.equal(after_plain, after_patched)


def test_patch_refuses_an_unknown_backend():
    with pytest.raises(ValueError, match="backend"):
        lt.patch("fast")


def test_every_rank_of_a_torchrun_trainer_is_patched(tmp_path, library):
    """transformers' Trainer as torchrun starts it (two ranks on the CPU, gloo; tests/ddp_transformers_trainer.py): the
    script's patch() patches its rank, every rank's matcher runs lucid-assign's kernel (said once a rank with
    LUCID_ASSIGN_VERBOSE=1), and every matcher call of every rank equals transformers' own on the same inputs."""
    import os
    import socket

    from ranks import ROOT, run_ranks

    pytest.importorskip("accelerate")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run_ranks(["-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port),
               os.path.join(ROOT, "tests", "ddp_transformers_trainer.py"), str(tmp_path)],
              "transformers' HungarianMatcher matches on cpu with lucid-assign's kernel", "transformers' own")
