"""RF-DETR's matcher patched (lucid_assign.integrations.rfdetr): a small RF-DETR built from its config (no weights, no
downloads) trained a few steps unpatched and patched, every matcher call the same (RF-DETR's own matcher under SciPy,
its CPU solver, is the oracle), the losses and the trained weights the same bit for bit; the matcher's other paths
(masks, keypoints, batch 1, layers of other dtypes, fixed-row padding) call by call; one op call per loss call; and
the case where RF-DETR's own batched solver (problems padded to the most objects) differs from SciPy."""

import contextlib
import copy
import os
import sys
import types
import warnings

import numpy as np
import pytest
import torch

pytest.importorskip("scipy")
try:
    from rfdetr.config import RFDETRSmallConfig, TrainConfig
    from rfdetr.models import _assignment
    from rfdetr.models import matcher as rf_matcher
    from rfdetr.models.lwdetr import build_criterion_from_config, build_model_from_config
    from rfdetr.utilities.tensors import NestedTensor
except ImportError as exc:  # pragma: no cover - CI installs rfdetr
    if os.environ.get("LUCID_REQUIRE_PEER") == "1":
        pytest.fail(f"rfdetr is required here: {exc}", pytrace=False)
    pytest.skip(f"rfdetr not installed: {exc}", allow_module_level=True)
from scipy.optimize import linear_sum_assignment  # noqa: E402

from lucid_assign import matching  # noqa: E402
from lucid_assign.integrations import rfdetr as lr  # noqa: E402

from conftest import devices, one_ulp_off  # noqa: E402

Matcher = rf_matcher.HungarianMatcher
QUERIES, GROUPS, CLASSES, SIDE = 20, 3, 5, 128  # per group; the criterion matches QUERIES * GROUPS queries


@pytest.fixture(autouse=True)
def restored():
    lr._verified.clear()
    yield
    lr.unpatch()


@pytest.fixture(scope="module")
def small():
    """RF-DETR Small's architecture at 128 px with 20 queries in 3 groups: (model, criterion), untrained."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = RFDETRSmallConfig(pretrain_weights=None, num_classes=CLASSES, device="cpu", resolution=SIDE,
                                   positional_encoding_size=SIDE // 16, num_queries=QUERIES, group_detr=GROUPS)
        train = TrainConfig(dataset_dir=".", output_dir=".")
        torch.manual_seed(0)
        model = build_model_from_config(config, train)
        criterion, _ = build_criterion_from_config(config, train)
    return model, criterion


def _objects(counts, g, device="cpu", masks=False):
    out = []
    for n in counts:
        centre = torch.rand(n, 2, generator=g) * 0.8 + 0.1
        size = torch.rand(n, 2, generator=g) * 0.3 + 0.02
        t = {"boxes": torch.cat([centre, size], 1), "labels": torch.randint(0, CLASSES, (n,), generator=g)}
        if n > 1:  # a repeated box and label: tied costs
            t["boxes"][1], t["labels"][1] = t["boxes"][0], t["labels"][0]
        if masks:
            t["masks"] = torch.rand(n, 16, 16, generator=g) > 0.5
        out.append({k: v.to(device) for k, v in t.items()})
    return out


def _plain(layer) -> list:
    for i, j in layer:
        assert i.dtype == j.dtype == torch.int64 and i.shape == j.shape and i.dim() == 1
    return [(i.tolist(), j.tolist()) for i, j in layer]


@contextlib.contextmanager
def recording(calls: list):
    """Every layer's matches as the criterion receives them: _match_many's (a list per layer) or forward's (one
    layer), forward counted only when the criterion called it (not from within _match_many)."""
    many, forward = Matcher._match_many, Matcher.forward
    inside = [0]

    def record_many(self, *args, **kwargs):
        inside[0] += 1
        try:
            found = many(self, *args, **kwargs)
        finally:
            inside[0] -= 1
        if found is not None:
            calls.extend(_plain(layer) for layer in found)
        return found

    def record_forward(self, *args, **kwargs):
        found = forward(self, *args, **kwargs)
        if not inside[0]:
            calls.append(_plain(found))
        return found

    Matcher._match_many, Matcher.forward = record_many, record_forward
    try:
        yield
    finally:
        Matcher._match_many, Matcher.forward = many, forward


@pytest.fixture
def scipy_own(monkeypatch):
    """RF-DETR's own matcher with SciPy as its solver on every device: its batched CUDA call as its CPU path solves
    (each layer's cost on the host, SciPy per group and image)."""
    own = Matcher.__dict__["_assign_compact_cost_matrix"]
    monkeypatch.setattr(_assignment, "assign_many_bucketed",
                        lambda costs, sizes, groups: [own(c.cpu(), sizes, groups) for c in costs])


@pytest.fixture
def op_calls(monkeypatch):
    """The op calls made (their batch sizes)."""
    calls = []
    run = matching.run

    def counted(chosen, cost, sizes):
        calls.append(cost.shape[0])
        return run(chosen, cost, sizes)

    monkeypatch.setattr(matching, "run", counted)
    return calls


# the objects per image of each step: ties, an empty image, more objects than a group's queries, no objects at all
STEPS = ([3, 7], [0, 25], [0, 0], [12, 1])


def _train(model, criterion, device, autocast, steps=STEPS):
    """Train a copy a few steps with AdamW: (every matcher call's matches, the losses, the weights)."""
    model = copy.deepcopy(model).to(device).train()
    criterion = copy.deepcopy(criterion).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    calls, losses = [], []
    with recording(calls):
        for counts in steps:
            images = torch.randn(len(counts), 3, SIDE, SIDE, generator=g).to(device)
            targets = _objects(counts, g, device)
            with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
                outputs = model(NestedTensor(images, torch.zeros(len(counts), SIDE, SIDE, dtype=torch.bool,
                                                                 device=device)))
                parts = criterion(outputs, targets)
            loss = sum(parts[k] * criterion.weight_dict[k] for k in parts if k in criterion.weight_dict)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.detach().cpu())
    return calls, losses, [p.detach().cpu() for p in model.parameters()]


def _detached(outputs):
    """The model's outputs as leaves of their own (the same values), so that two criteria can be run on them and
    differentiated apart."""
    if isinstance(outputs, dict):
        return {k: _detached(v) for k, v in outputs.items()}
    if isinstance(outputs, list):
        return [_detached(v) for v in outputs]
    if isinstance(outputs, torch.Tensor) and outputs.is_floating_point():
        return outputs.detach().clone().requires_grad_(outputs.requires_grad)
    return outputs


def _leaves(outputs) -> list:
    if isinstance(outputs, dict):
        return [t for v in outputs.values() for t in _leaves(v)]
    if isinstance(outputs, list):
        return [t for v in outputs for t in _leaves(v)]
    return [outputs] if isinstance(outputs, torch.Tensor) and outputs.requires_grad else []


def _loss(criterion, outputs, targets, calls):
    with recording(calls):
        parts = criterion(outputs, targets)
    return sum(parts[k] * criterion.weight_dict[k] for k in parts if k in criterion.weight_dict)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("autocast", [False, True], ids=["float32", "bf16-autocast"])
def test_training_steps_match_rfdetr_own(small, device, autocast, scipy_own, op_calls, library):
    """Four training steps (final, auxiliary and encoder layers, 3 query groups): at each, the criterion unpatched
    and patched on the same outputs, every matcher call equal to RF-DETR's own under SciPy, the losses and their
    gradients (as to every output of the model) bit for bit, and every loss call's layers solved in one op call. The
    model trains on the patched loss (its backward on CUDA is not deterministic: two runs are compared step by step,
    not across steps)."""
    model, criterion = small
    model = copy.deepcopy(model).to(device).train()
    criterion = copy.deepcopy(criterion).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    for step, counts in enumerate(STEPS):
        images = torch.randn(len(counts), 3, SIDE, SIDE, generator=g).to(device)
        targets = _objects(counts, g, device)
        mask = torch.zeros(len(counts), SIDE, SIDE, dtype=torch.bool, device=device)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
            outputs = model(NestedTensor(images, mask))
            mine, theirs = _detached(outputs), _detached(outputs)
            own_calls, our_calls = [], []
            before = len(op_calls)
            own = _loss(criterion, theirs, targets, own_calls)
            assert len(op_calls) == before
            with lr.patched():
                ours = _loss(criterion, mine, targets, our_calls)
                assert len(op_calls) == before + (sum(counts) > 0)  # one per loss call with objects
                patched = _loss(criterion, outputs, targets, [])
        assert len(our_calls) == len(own_calls) >= 4
        for k, (a, b) in enumerate(zip(our_calls, own_calls)):
            assert a == b, f"step {step}, matcher call {k}"
        assert torch.equal(ours, own), (step, ours, own)
        for a, b in zip(torch.autograd.grad(ours, _leaves(mine)), torch.autograd.grad(own, _leaves(theirs))):
            assert torch.equal(a, b)
        optimizer.zero_grad()
        patched.backward()
        optimizer.step()
    assert lr._verified and all(lr._verified.values())  # the batched routes' costs were RF-DETR's own


def test_training_on_the_cpu_is_the_same_run(small, scipy_own, library):
    """On the CPU (a deterministic backward) four training steps unpatched and four patched, from the same weights:
    the same matches, losses and trained weights, bit for bit."""
    model, criterion = small
    own = _train(model, criterion, "cpu", True)
    with lr.patched():
        ours = _train(model, criterion, "cpu", True)
    assert ours[0] == own[0]
    assert all(torch.equal(a, b) for a, b in zip(ours[1], own[1]))
    assert all(torch.equal(a, b) for a, b in zip(ours[2], own[2]))


def _outputs(layers, images, queries, device, g, dtypes=None, masks=False):
    """Synthetic decoder outputs of ``layers`` layers: [final, aux..., enc]."""
    out = []
    for k in range(layers):
        dtype = dtypes[k] if dtypes else torch.float32
        o = {"pred_logits": torch.randn(images, queries, CLASSES, generator=g).to(device, dtype),
             "pred_boxes": (torch.rand(images, queries, 4, generator=g) * 0.5 + 0.1).to(device, dtype)}
        if masks:
            o["pred_masks"] = torch.randn(images, queries, 16, 16, generator=g).to(device)
        out.append(o)
    return out


def _own_calls(m, outputs, targets, groups):
    """The criterion's matching with the unpatched matcher: _match_many, or each layer's forward where it declines."""
    found = Matcher._match_many(m, outputs, targets, group_detr=groups)
    return found if found is not None else [m(o, targets, group_detr=groups) for o in outputs]


def _same_calls(m, outputs, targets, groups, autocast=False):
    device = outputs[0]["pred_boxes"].device.type
    with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
        torch.manual_seed(5)  # the mask cost draws its points
        own = [_plain(layer) for layer in _own_calls(m, outputs, targets, groups)]
        with lr.patched():
            torch.manual_seed(5)
            ours = [_plain(layer) for layer in _own_calls(m, outputs, targets, groups)]
    assert ours == own
    return ours


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("case", ["detection", "batch 1", "masks", "mixed dtypes", "fixed rows", "one layer",
                                  "more objects than queries", "no objects"])
def test_each_path_matches_rfdetr_own(device, case, scipy_own, op_calls, library):
    """Each of the matcher's paths, call by call, against RF-DETR's own under SciPy; one op call for all layers."""
    g = torch.Generator().manual_seed(len(case))
    m = Matcher(cost_class=2, cost_bbox=5, cost_giou=2)
    layers, counts, dtypes = 4, [4, 9, 1], None
    if case == "batch 1":
        counts = [6]
    elif case == "mixed dtypes":  # RF-DETR's encoder output under CPU autocast
        dtypes = [torch.float32] * 3 + [torch.bfloat16]
    elif case == "fixed rows":  # XLA's fixed-size targets: every image has 6 rows, the last ones filler
        counts = [6, 6, 6]
    elif case == "one layer":
        layers = 1
    elif case == "more objects than queries":
        counts = [QUERIES + 3, 2, 0]
    elif case == "no objects":
        counts = [0, 0, 0]
    targets = _objects(counts, g, device, masks=case == "masks")
    if case == "fixed rows":
        for t, n in zip(targets, [4, 6, 1]):
            t["valid"] = torch.arange(6, device=device) < n
    outputs = _outputs(layers, len(counts), QUERIES * GROUPS, device, g, dtypes, masks=case == "masks")
    _same_calls(m, outputs, targets, GROUPS, autocast=dtypes is not None)  # (mixed: under autocast, as trained)
    assert len(op_calls) == (0 if case == "no objects" else 1)
    batched = case in ("detection", "more objects than queries", "mixed dtypes")
    assert list(lr._verified.values()) == ([True] if batched else [])  # the batched route, its costs RF-DETR's


@pytest.mark.parametrize("value", [float("nan"), 2.0e18, 1.0e18], ids=["nan", "beyond its bound", "within it"])
@pytest.mark.parametrize("device", devices())
def test_unsafe_values_decline_as_rfdetr_does(device, value, scipy_own, library):
    """A box coordinate in one layer that is not finite or beyond RF-DETR's bound (finfo.max ** 0.5 / 16, about
    1.15e18 in float32): RF-DETR's _match_many declines and each layer goes through forward (the full path's sanitised
    cost for that layer); the patched matcher declines the same way, with the same matches. Within the bound both
    match the layers together."""
    g = torch.Generator().manual_seed(3)
    m = Matcher()
    targets = _objects([3, 5], g, device)
    outputs = _outputs(3, 2, QUERIES * GROUPS, device, g)
    outputs[1]["pred_boxes"][0, 4, 2] = value
    declines = value != 1.0e18
    assert (Matcher._match_many(m, outputs, targets, group_detr=GROUPS) is None) == declines
    with lr.patched():
        assert (Matcher._match_many(m, outputs, targets, group_detr=GROUPS) is None) == declines
    _same_calls(m, outputs, targets, GROUPS)


@pytest.mark.parametrize("device", devices())
def test_no_stale_matches(device, scipy_own, library):
    """The same tensors changed in place, other targets, other groups: each call matched afresh (a cache of an earlier
    call's matches would fail here)."""
    g = torch.Generator().manual_seed(4)
    m = Matcher()
    targets = _objects([5, 8], g, device)
    outputs = _outputs(3, 2, QUERIES * GROUPS, device, g)
    first = _same_calls(m, outputs, targets, GROUPS)
    outputs[2]["pred_boxes"].copy_(outputs[2]["pred_boxes"].flip(1))
    targets[1]["labels"].add_(1).remainder_(CLASSES)
    second = _same_calls(m, outputs, targets, GROUPS)
    assert second[2] != first[2]
    third = _same_calls(m, outputs, targets[::-1], GROUPS)
    assert third != second
    _same_calls(m, outputs, targets, 2 * GROUPS)


def test_rfdetr_padded_solve_differs_from_scipy(monkeypatch):
    """RF-DETR's own batched solve pads every image's objects to the batch's most; where that is a group's queries
    the padded problem is square and, on ties, its optimum is not SciPy's on the image's own cost. Here torch-linear-
    assignment's host path (SciPy on each padded problem, what the package runs off CUDA) stands in for its solver.
    Image 1 has one object that every query reaches at the same cost: SciPy takes query 0, the padded problem another.
    The patched matcher gives SciPy's."""
    fake = types.ModuleType("torch_linear_assignment")

    def batch_linear_assignment(cost):
        out = torch.full(cost.shape[:2], -1, dtype=torch.int64)
        for b in range(cost.shape[0]):
            r, c = linear_sum_assignment(cost[b].numpy())
            out[b, torch.from_numpy(r)] = torch.from_numpy(c)
        return out

    fake.batch_linear_assignment = batch_linear_assignment
    monkeypatch.setitem(sys.modules, "torch_linear_assignment", fake)
    cost = torch.tensor([[0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.0, 1.0], [1.0, 1.0, 0.0, 1.0]])  # 3 queries; 3 + 1 objects
    theirs = _assignment.assign_many_bucketed([cost], [3, 1], 1)[0]
    assert _plain(theirs)[1] == ([2], [0])
    assert tuple(a.tolist() for a in linear_sum_assignment(cost[:, 3:].numpy())) == ([0], [0])
    ours = lr.solve_blocks([cost], [3, 1], 1, "reference", host=True)[0]
    assert _plain(ours) == [([0, 1, 2], [0, 1, 2]), ([0], [0])]


def test_patch_report_and_unpatch():
    own = (Matcher.__dict__["_match_many"], Matcher.__dict__["_assign_compact_cost_matrix"],
           _assignment.assign_many_bucketed)
    lr.patch()
    assert lr.is_patched() and lr.patch_report() == ["HungarianMatcher: patched"]
    assert Matcher.__dict__["_match_many"] is not own[0]
    lr.patch("reference")  # idempotent: a new backend only
    lr.unpatch()
    assert (Matcher.__dict__["_match_many"], Matcher.__dict__["_assign_compact_cost_matrix"],
            _assignment.assign_many_bucketed) == own
    with pytest.raises(ValueError, match="backend"):
        lr.patch("fastest")


def test_group_count_error_is_rfdetr_own(library):
    m = Matcher()
    g = torch.Generator().manual_seed(6)
    targets = _objects([2, 3], g)
    outputs = _outputs(2, 2, 10, "cpu", g)
    with lr.patched(), pytest.raises(ValueError, match=r"num_queries \(10\) must be divisible by group_detr \(3\)"):
        Matcher._match_many(m, outputs, targets, group_detr=3)


def test_ragged_problems_in_one_call_equal_scipy(op_calls, library):
    """solve_blocks: several layers' costs, images of 0 to more objects than a group's queries, in one op call,
    each image and group SciPy's choice on its own block (integer costs: ties everywhere)."""
    g = torch.Generator().manual_seed(7)
    sizes, groups, per_group = [0, 2, 7, 3], 2, 5
    costs = [torch.randint(0, 3, (groups * per_group, sum(sizes)), generator=g).float() for _ in range(3)]
    found = lr.solve_blocks(costs, sizes, groups, "kernel", host=True)
    assert op_calls == [3 * len(sizes) * groups]
    for cost, layer in zip(costs, found):
        start = np.cumsum([0] + sizes)
        for b, (rows, cols) in enumerate(layer):
            want_r, want_c = [], []
            for q in range(groups):
                r, c = linear_sum_assignment(cost[q * per_group:(q + 1) * per_group, start[b]:start[b + 1]].numpy())
                want_r += (r + q * per_group).tolist()
                want_c += c.tolist()
            assert (rows.tolist(), cols.tolist()) == (want_r, want_c)


def test_bench_runs(capsys, library):
    """bench/train_step_rfdetr.py on the CPU at a tiny size: both matchers' steps and the matching's share."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
    try:
        import train_step_rfdetr
    finally:
        sys.path.pop(0)
    train_step_rfdetr.main(["--device", "cpu", "--variant", "small", "--imgsz", "64", "--batch", "2", "--objects",
                            "3", "--steps", "2", "--warmup", "1"])
    out = capsys.readouterr().out
    assert "small     64       3 own" in out and "small     64       3 patched" in out and "faster" in out


def test_every_rank_of_a_lightning_ddp_run_is_patched(library):
    """RF-DETR's model and criterion under Lightning's DDP strategy, as RF-DETR's trainer runs them (two ranks on the
    CPU, gloo; tests/ddp_rfdetr_lightning.py): Lightning starts the second rank by running the script again, whose
    patch() patches it; every rank's matcher runs lucid-assign's kernel (said once a rank with LUCID_ASSIGN_VERBOSE=1,
    with its rank) and every call equals RF-DETR's own on the same inputs."""
    from ranks import ROOT, run_ranks

    pytest.importorskip("pytorch_lightning")
    run_ranks([os.path.join(ROOT, "tests", "ddp_rfdetr_lightning.py")],
              r"RF-DETR's matcher \(batched\) matches on cpu with lucid-assign's kernel", "RF-DETR's own")


def test_a_spawned_process_that_unpickles_a_patched_matcher_is_patched(library):
    """Lightning's spawn-based DDP (RF-DETR's strategy in notebooks) pickles the criterion into fresh processes, which
    import rfdetr unpatched: a matcher pickled while patched patches the process that unpickles it (with the same
    backend), so that no rank silently runs RF-DETR's own matcher; unpatched, a matcher pickles as RF-DETR's own."""
    import multiprocessing
    import pickle

    from spawned_matcher import report

    m = Matcher(cost_bbox=7)
    with lr.patched("reference"):
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            assert pool.apply(report, (m,)) == (True, True, "reference", True, 7)
        assert type(pickle.loads(pickle.dumps(m))) is Matcher
    assert "__reduce_ex__" not in vars(Matcher)
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        assert pool.apply(report, (m,)) == (True, False, "auto", False, 7)


def _degenerate(outputs, targets):
    """Boxes RF-DETR's floors and clamps meet: a query of no size on an object of no size (their union and enclosure
    0), a query of negative width, a query exactly on an object."""
    t = targets[0]
    t["boxes"][0] = torch.tensor([0.5, 0.5, 0.0, 0.0])
    for o in outputs:
        o["pred_boxes"][0, 0] = torch.tensor([0.5, 0.5, 0.0, 0.0])
        o["pred_boxes"][0, 1, 2] = -0.25
        o["pred_boxes"][0, 2] = t["boxes"][1]


COST_REGIONS = {"float32": (torch.float32, None), "bf16": (torch.bfloat16, None), "fp16": (torch.float16, None),
                "bf16 autocast": (torch.float32, torch.bfloat16)}


@pytest.mark.parametrize("region", list(COST_REGIONS))
@pytest.mark.parametrize("device", devices())
def test_the_cost_op_is_rfdetrs_detection_cost(device, region, library):
    """torch.ops.lucid.detr_cost.parts with RF-DETR's class term and boxes: every layer's cost per image block, bit
    for bit RF-DETR's own compact cost (its layers stacked, and each layer alone, as it computes them by size), in
    the outputs' dtypes and an autocast region, with 1 and 3 query groups, an image without objects, and the boxes
    its floors and clamps meet."""
    dtype, autocast = COST_REGIONS[region]
    mod, _ = lr._modules()
    g = torch.Generator().manual_seed(7)
    m = Matcher(cost_class=2, cost_bbox=5, cost_giou=2, focal_alpha=0.25)
    counts, layers = [4, 0, 9], 3
    targets = [{k: (v.to(dtype) if v.is_floating_point() else v) for k, v in t.items()}
               for t in _objects(counts, g, device)]
    outputs = [{k: v.to(dtype) for k, v in o.items()} for o in _outputs(layers, len(counts), QUERIES * GROUPS,
                                                                         device, g)]
    _degenerate(outputs, targets)
    labels, objects = torch.cat([t["labels"] for t in targets]), torch.cat([t["boxes"] for t in targets])
    for groups in (1, GROUPS):
        where = lr.core.layout(counts, QUERIES * GROUPS, groups, device)
        for together in ([list(range(layers))], [[k] for k in range(layers)]):
            stacks = [(torch.stack([outputs[k]["pred_logits"] for k in ks]),
                       torch.stack([outputs[k]["pred_boxes"] for k in ks])) for ks in together]
            with torch.autocast(device, dtype=autocast or torch.bfloat16, enabled=autocast is not None):
                lr._plans.clear()
                cost, invalid = lr._op_cost(m, mod, together, stacks, labels, objects, where)
                if len(together) == 1:
                    theirs = m._compute_stacked_compact_cost_matrices(outputs, targets)
                else:
                    theirs = [m._compute_compact_detection_cost_matrix(o, targets, clamp_target_labels=True)
                              for o in outputs]
            assert int(invalid) == 0
            ours = lr._as_theirs(cost.view(layers * len(counts), QUERIES * GROUPS, -1), counts, layers)
            for a, b in zip(ours, theirs):
                assert a.dtype == b.float().dtype and torch.equal(a.view(torch.int32), b.float().view(torch.int32)), \
                    (groups, len(together))


def _rounded_apart(m, dtype):
    """A logit in [-6, 6) whose focal term (RF-DETR's own) ATen's CPU loops round apart in their vectorised body (a
    tensor of 6,144 of them) and in their scalar tail (tensors of 15, under any vector width's two vectors), or None."""
    xs = (torch.arange(-3072, 3072) / 512).to(dtype)
    body = m._focal_classification_cost(xs)
    tail = torch.cat([m._focal_classification_cost(part) for part in xs.split(15)])
    apart = (body != tail).nonzero()
    return float(xs[apart[0, 0]]) if len(apart) else None


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("logits", [torch.bfloat16, torch.float32])
def test_the_cost_op_is_each_rfdetr_forwards_cost(device, logits, library):
    """detr_cost.parts on RF-DETR's "layers" route (its layers' dtypes differ: the encoder's bf16 boxes under
    autocast, its logits bf16 or float32): every layer's cost per image block in one call, bit for bit the cost each
    layer's forward hands its solver (its compact cost, or its cost over the cross product of queries and objects for
    the layer whose boxes' dtype is not the objects': on the CPU a few of its class terms differ from the compact
    layout's, as the vectorised math rounds an element by its place), with 1 and 3 query groups, an image without
    objects, and the boxes its floors and clamps meet."""
    mod, _ = lr._modules()
    g = torch.Generator().manual_seed(11)
    m = Matcher(cost_class=2, cost_bbox=5, cost_giou=2, focal_alpha=0.25)
    # 3 images of 60 queries and 5, 0, 8 objects: the cross product's last entry (the last image's last query and
    # object) falls in the scalar tail of ATen's vectorised CPU loops, the compact layout's last entry (the same one)
    # in their vectorised body (180 x 13 entries against 180 x 8); it takes a logit whose focal term the two paths
    # round apart, where this machine's ATen has one
    counts, layers = [5, 0, 8], 4
    targets = _objects(counts, g, device)
    outputs = _outputs(layers, len(counts), QUERIES * GROUPS, device, g, [torch.float32] * 3 + [torch.bfloat16])
    outputs[-1]["pred_logits"] = outputs[-1]["pred_logits"].to(logits) * 4  # (spread: the focal term's range)
    apart = _rounded_apart(m, logits)
    if apart is not None:
        outputs[-1]["pred_logits"][-1, -1, targets[-1]["labels"][-1]] = apart
    _degenerate(outputs, targets)
    labels, objects = torch.cat([t["labels"] for t in targets]), torch.cat([t["boxes"] for t in targets])
    together = [[0, 1, 2], [3]]  # (a part of one layer: its own tensors, as the patched matcher passes them)
    stacks = [tuple(torch.stack([outputs[k][key] for k in ks]) if len(ks) > 1 else outputs[ks[0]][key]
                    for key in ("pred_logits", "pred_boxes")) for ks in together]
    for groups in (1, GROUPS):
        where = lr.core.layout(counts, QUERIES * GROUPS, groups, device)
        with torch.autocast(device, dtype=torch.bfloat16):
            lr._plans.clear()
            cost, invalid = lr._op_cost(m, mod, together, stacks, labels, objects, where, "layers")
            with lr.patched():
                theirs = [t.cost for t in lr._taken(m, outputs, targets, groups, None)]
        assert int(invalid) == 0
        ours = lr._as_theirs(cost.view(layers * len(counts), QUERIES * GROUPS, -1), counts, layers)
        for k, (a, b) in enumerate(zip(ours, theirs)):  # (RF-DETR's full cost on the host)
            assert torch.equal(a.cpu().view(torch.int32), b.cpu().float().view(torch.int32)), (groups, k)


def test_a_cost_one_unit_in_the_last_place_off_fails_the_guard(monkeypatch, scipy_own, library):
    """The first detection step of a kind compares the op's cost with RF-DETR's own entry by entry: one entry nudged
    by one unit in the last place fails it (RF-DETR computes the costs of such steps from then on, said once; the
    solves stay on the op), and the matches stay RF-DETR's; unnudged, it passes."""
    g = torch.Generator().manual_seed(9)
    m = Matcher(cost_class=2, cost_bbox=5, cost_giou=2)
    targets = _objects([4, 6], g)
    outputs = _outputs(3, 2, QUERIES * GROUPS, "cpu", g)
    real = lr.ops.detr_family_parts_cost
    for nudge in (False, True):
        monkeypatch.setattr(lr.ops, "detr_family_parts_cost", one_ulp_off(real, nudge))
        lr._verified.clear()
        said = pytest.warns(UserWarning, match="costs differed from RF-DETR's own") if nudge \
            else contextlib.nullcontext()
        with said:
            _same_calls(m, outputs, targets, GROUPS)
        assert list(lr._verified.values()) == [not nudge]
