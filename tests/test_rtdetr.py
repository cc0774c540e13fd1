"""The peer's (ultralytics) RT-DETR matcher patched (lucid_assign.integrations.ultralytics): the same costs, the same
matches (SciPy's), the same loss values, bit for bit, on each device; what patch() does without SciPy; patch and
unpatch hygiene. The releases' variants of the matcher are checked in tests/test_peer_releases.py."""

import subprocess
import sys

import pytest
import torch

from conftest import devices

pytest.importorskip("scipy.optimize", reason="SciPy is the peer matcher's solver and the oracle")


@pytest.fixture
def integ(peer_tal, library):
    from lucid_assign.integrations import ultralytics as integ

    yield integ
    integ.unpatch()


def matcher_inputs(device, dtype=torch.float32, seed=0, groups=(10, 0, 50, 3, 1)):
    """(pred_bboxes, pred_scores, gt_bboxes, gt_cls, gt_groups) as the peer's loss passes them: 300 queries, 80
    classes, normalised xywh boxes, an image without objects and duplicated objects (exact ties)."""
    g = torch.Generator().manual_seed(seed)
    bs, nq, nc, total = len(groups), 300, 80, sum(groups)
    gt = torch.cat((0.15 + 0.7 * torch.rand(total, 2, generator=g), 0.02 + 0.3 * torch.rand(total, 2, generator=g)), 1)
    cls = torch.randint(0, nc, (total,), generator=g)
    gt[1], cls[1] = gt[0], cls[0]
    pred = torch.cat((torch.rand(bs, nq, 2, generator=g), 0.02 + 0.4 * torch.rand(bs, nq, 2, generator=g)), -1)
    logits = torch.randn(bs, nq, nc, generator=g) * 2
    return (pred.to(device, dtype), logits.to(device, dtype), gt.to(device), cls.to(device), list(groups))


def same_matches(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(i.cpu(), k.cpu()) and torch.equal(j.cpu(), m.cpu())
                                    for (i, j), (k, m) in zip(a, b))


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
def test_patched_matcher_gives_the_peers_matches(integ, device, dtype):
    from ultralytics.models.utils import loss, ops

    peer_cls = ops.HungarianMatcher
    integ.patch()
    assert loss.HungarianMatcher is integ.LucidHungarianMatcher and ops.HungarianMatcher is integ.LucidHungarianMatcher
    for kw in (dict(cost_gain={"class": 2, "bbox": 5, "giou": 2}), dict(use_fl=False)):
        ours, theirs = loss.HungarianMatcher(**kw), peer_cls(**kw)
        for seed in range(3):
            inputs = matcher_inputs(device, dtype, seed)
            got = ours(*inputs)
            assert same_matches(got, theirs(*inputs))
            assert got[0][0].device.type == device and got[0][0].dtype == torch.long


def test_calls_alternating_object_counts(integ):
    """Consecutive calls with other object counts per image (the kept layouts of earlier calls) each give the peer's
    matches."""
    from ultralytics.models.utils import loss, ops

    theirs = ops.HungarianMatcher()
    integ.patch()
    ours = loss.HungarianMatcher()
    assert type(ours) is not type(theirs)
    for seed, groups in enumerate([(10, 0, 50), (3, 3, 3), (10, 0, 50), (0, 60, 1), (3, 3, 3)]):
        inputs = matcher_inputs("cpu", seed=seed, groups=groups)
        assert same_matches(ours(*inputs), theirs(*inputs))


def rtdetr_loss_inputs(device, seed=0, layers=6, groups=(10, 0, 50, 3)):
    g = torch.Generator().manual_seed(seed)
    pred, logits, gt, cls, groups = matcher_inputs("cpu", seed=seed, groups=groups)
    bs, nq, nc = logits.shape
    bboxes = torch.stack([pred + 0.01 * torch.randn(pred.shape, generator=g) for _ in range(layers)]).clamp(0, 1)
    scores = torch.stack([logits + torch.randn(logits.shape, generator=g) for _ in range(layers)])
    batch = {"cls": cls.to(device), "bboxes": gt.to(device), "gt_groups": groups}
    return bboxes.to(device).requires_grad_(), scores.to(device).requires_grad_(), batch


def rtdetr_loss(device):
    """RTDETRDetectionLoss, built afresh, on rtdetr_loss_inputs: the loss values and the predictions' gradients."""
    from ultralytics.models.utils.loss import RTDETRDetectionLoss

    criterion = RTDETRDetectionLoss(nc=80, use_vfl=True)
    bboxes, scores, batch = rtdetr_loss_inputs(device)
    losses = criterion((bboxes, scores), batch)
    sum(losses.values()).backward()
    return {k: v.detach() for k, v in losses.items()}, bboxes.grad, scores.grad


def assert_same_loss(a, b):
    assert a[0].keys() == b[0].keys()
    assert all(torch.equal(a[0][k], b[0][k]) for k in a[0]), (a[0], b[0])
    assert torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])


@pytest.mark.parametrize("device", devices())
def test_rtdetr_loss_identical_patched_and_unpatched(integ, device):
    """RTDETRDetectionLoss (the decoder's six layers: the last and the auxiliary ones) gives the same loss values and
    gradients, bit for bit, with the matcher patched."""
    plain = rtdetr_loss(device)
    integ.patch()
    assert_same_loss(plain, rtdetr_loss(device))


def rtdetr_model_loss():
    """The peer's RT-DETR model (rtdetr-l.yaml, no weights, built afresh) at 160 px, three images: its training loss,
    denoising included, and the loss items."""
    from ultralytics.nn.tasks import RTDETRDetectionModel

    g = torch.Generator().manual_seed(1)
    groups = [3, 0, 6]
    idx = torch.cat([torch.full((n,), float(b)) for b, n in enumerate(groups)])
    boxes = torch.cat((0.2 + 0.6 * torch.rand(len(idx), 2, generator=g), 0.05 + 0.3 * torch.rand(len(idx), 2,
                                                                                                    generator=g)), 1)
    batch = {"img": torch.rand(3, 3, 160, 160, generator=g), "batch_idx": idx, "bboxes": boxes,
             "cls": torch.randint(0, 80, (len(idx), 1), generator=g).float()}

    torch.manual_seed(0)
    model = RTDETRDetectionModel("rtdetr-l.yaml", nc=80, verbose=False)
    model.nc = 80  # the trainer attaches the dataset's class count
    model.train()
    torch.manual_seed(1)  # the denoising queries draw their noise
    loss, items = model.loss(batch)
    items = items if isinstance(items, dict) else dict(enumerate(items))
    return loss.detach(), {k: v.detach() for k, v in items.items()}


def test_rtdetr_model_loss_identical_patched_and_unpatched(integ):
    """The peer's RT-DETR model: its training loss, denoising included, the same with the matcher patched."""
    plain = rtdetr_model_loss()
    integ.patch()
    patched = rtdetr_model_loss()
    assert torch.equal(plain[0], patched[0]), (plain, patched)
    assert plain[1].keys() == patched[1].keys() and all(torch.equal(plain[1][k], patched[1][k]) for k in plain[1])


def test_without_scipy_the_matcher_is_left_to_the_peer(integ, monkeypatch):
    """Without SciPy the peer matches with its own NumPy solver, whose ties may differ from SciPy's: patch() leaves
    the matcher to the peer and says why (the assigners are patched as before)."""
    from lucid_assign.integrations import ultralytics_detr
    from ultralytics.models.utils import loss

    original = loss.HungarianMatcher
    monkeypatch.setattr(ultralytics_detr, "peer_solver_is_scipy", lambda: False)
    monkeypatch.setattr(integ.STATE, "said", set())
    integ.patch()  # the matcher's check waits for the first matcher built
    with pytest.warns(integ.FallbackWarning, match="HungarianMatcher is left to ultralytics .*NumPy solver"):
        first = loss.HungarianMatcher()
    assert first.variant is None  # it hands every call to the peer's own matcher
    inputs = matcher_inputs("cpu")
    assert same_matches(first(*inputs), original()(*inputs))
    assert loss.HungarianMatcher is original
    assert any(line.startswith("HungarianMatcher: left to ultralytics") for line in integ.patch_report())
    assert any(line.startswith("TaskAlignedAssigner: patched") for line in integ.patch_report())


def test_the_matchers_check_waits_for_the_first_matcher(integ, monkeypatch):
    """patch() does not check the RT-DETR matcher (SciPy's import and the peer's matcher: a cost at the start of
    every fit, and a YOLO fit never builds one); the first matcher built runs the check, once."""
    calls = []
    check = integ.check_matcher_of_peer
    monkeypatch.setattr(integ, "check_matcher_of_peer", lambda: calls.append(1) or check())
    from ultralytics.models.utils import loss

    integ.patch()
    assert not calls
    loss.HungarianMatcher()
    loss.HungarianMatcher()
    assert len(calls) == 1
    assert "HungarianMatcher: patched (padded cost, widened to float32, non-finite costs to 0)" in integ.patch_report()
    integ.unpatch()
    integ.patch()
    assert len(calls) == 1 and "HungarianMatcher: patched" in " ".join(integ.patch_report())  # the report checks
    assert len(calls) == 2


def test_patch_leaves_scipy_unimported(library, peer_tal):
    """What patch() adds to a YOLO fit's start: no SciPy (a third of a second or more to import), which such a fit
    never imports itself."""
    code = ("import sys, ultralytics, ultralytics.utils.loss\n"
            "from lucid_assign.integrations import ultralytics as integ\n"
            "integ.patch()\n"
            "print('SciPy imported:', 'scipy.optimize' in sys.modules)\n"
            "from ultralytics.models.utils.loss import HungarianMatcher\n"
            "HungarianMatcher()\n"
            "print('SciPy imported:', 'scipy.optimize' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    said = [line.split(":")[1].strip() for line in out.stdout.splitlines() if line.startswith("SciPy imported:")]
    assert said == ["False", "True"], out.stdout[-3000:]  # (the peer may print its own notes in between)


def test_unpatch_restores_the_matcher(integ):
    from ultralytics.models.utils import loss, ops

    before = loss.HungarianMatcher, ops.HungarianMatcher
    integ.patch()
    assert "HungarianMatcher: patched (padded cost, widened to float32, non-finite costs to 0)" in integ.patch_report()
    integ.unpatch()
    assert (loss.HungarianMatcher, ops.HungarianMatcher) == before
    assert integ.LucidHungarianMatcher.variant is None


def test_a_matcher_built_while_patched_stays_lucid_assigns(integ, monkeypatch):
    """A model built while patched keeps lucid-assign's matcher after unpatch(), as it keeps the patched assigners
    (bench/train_step.py times models built in a patched() block): the matcher does not hand its calls to the peer."""
    from ultralytics.models.utils import loss, ops

    integ.patch()
    ours = loss.HungarianMatcher()
    integ.unpatch()
    peer = ops.HungarianMatcher()
    monkeypatch.setattr(ours, "_peer_matcher", None)  # a call handed to the peer would fail
    inputs = matcher_inputs("cpu")
    assert ours.variant is not None and type(ours) is not type(peer)
    assert same_matches(ours(*inputs), peer(*inputs))
    assert type(loss.HungarianMatcher()) is type(peer)  # one built now is the peer's


def test_matcher_falls_back_to_the_peer_for_mask_costs(integ):
    """A call with the mask inputs of early releases is the peer's own matcher's (the peer raises or computes it)."""
    from ultralytics.models.utils import loss

    integ.patch()
    ours = loss.HungarianMatcher()
    inputs = matcher_inputs("cpu")
    with pytest.raises(TypeError):  # this release's matcher takes no masks: the peer's own error
        ours(*inputs, masks=torch.zeros(1))


@pytest.fixture
def solves(monkeypatch):
    """The batch sizes of the patched matcher's calls of the solver, with the one-pass cost on the CPU too (the L1 in
    the CPU's order), as the matcher computes it on CUDA: what the matcher does with a stack of layers."""
    from lucid_assign.integrations import ultralytics_detr as detr

    checked = detr._fused_order
    monkeypatch.setattr(detr, "_fused_order", lambda m, variant, pred, *rest: (checked(m, variant, pred, *rest)
                                                                               if pred.is_cuda else 0))
    sizes, solve = [], detr.ops.linear_sum_assignment

    def counted(cost, sizes_=None):
        sizes.append(cost.shape[0])
        return solve(cost, sizes_)

    monkeypatch.setattr(detr.ops, "linear_sum_assignment", counted)
    return sizes


@pytest.mark.parametrize("device", devices())
def test_the_layers_of_a_loss_call_are_matched_in_one_solve(integ, device, solves, monkeypatch):
    """RTDETRDetectionLoss calls the matcher once per layer of its (L, B, Q, .) stack: the patched matcher solves every
    layer's problems in one call at the stack's first call, and the loss values and gradients are those of one solve
    per layer, bit for bit."""
    from lucid_assign.integrations import _matching as core, ultralytics_detr as detr
    from ultralytics.models.utils.loss import RTDETRDetectionLoss

    integ.patch()
    if device == "cuda":
        matcher = RTDETRDetectionLoss(nc=80).matcher
        if detr._check_fused(matcher, matcher.variant, torch.device(device)) is None:
            pytest.skip("the one-pass cost is not the peer's on this device, so each call keeps the peer's operations")
    together = rtdetr_loss(device)
    assert solves == [6 * 4]  # six layers of four images
    solves.clear()
    monkeypatch.setattr(core, "MAX_LAYERS", 1)  # no stack is one any more: a solve per call
    apart = rtdetr_loss(device)
    assert solves == [4] * 6
    assert_same_loss(together, apart)


def test_layer_matches_follow_their_inputs(integ, solves):
    """Between two calls on layers of one stack the stack is changed in place, or the objects are other tensors, or a
    layer is asked for twice: each call gives the matches of what it is given (those of a call on a copy of its
    layer, which is no stack's), never what an earlier call saw."""
    from ultralytics.models.utils import loss

    integ.patch()
    ours = loss.HungarianMatcher()
    bboxes, scores, batch = rtdetr_loss_inputs("cpu")
    bboxes, scores = bboxes.detach(), scores.detach()
    gt, cls, groups = batch["bboxes"], batch["cls"], batch["gt_groups"]

    def alone(layer, objects=gt):
        return ours(bboxes[layer].clone(), scores[layer].clone(), objects, cls, groups)

    assert same_matches(ours(bboxes[5], scores[5], gt, cls, groups), alone(5))
    assert solves == [24, 4]  # the stack's six layers at once, then the copy alone
    bboxes[2].copy_(bboxes[4].flip(0))  # the stack changed in place: its version moves on
    assert not same_matches(alone(2), alone(4))
    assert same_matches(ours(bboxes[2], scores[2], gt, cls, groups), alone(2))
    assert same_matches(ours(bboxes[3], scores[3], gt, cls, groups), alone(3))
    assert same_matches(ours(bboxes[3], scores[3], gt, cls, groups), alone(3))  # asked twice
    other = gt.flip(0).contiguous()
    assert same_matches(ours(bboxes[1], scores[1], other, cls, groups), alone(1, other))


@pytest.mark.parametrize("how", ("pickle", "deepcopy"))
def test_a_patched_matcher_pickles(integ, solves, how):
    """Trainers deep-copy their model, and early releases save it with its loss: a patched matcher, one that matched a
    stack included, pickles (while patched, the peer's own matcher inside it cannot be named, so it is built again), and
    its copy matches as it does, with its own settings and fallback."""
    import copy
    import io

    from ultralytics.models.utils import loss

    integ.patch()
    ours = loss.HungarianMatcher(cost_gain={"class": 1, "bbox": 5, "giou": 2}, alpha=0.3)
    bboxes, scores, batch = rtdetr_loss_inputs("cpu")
    bboxes, scores = bboxes.detach(), scores.detach()
    args = (batch["bboxes"], batch["cls"], batch["gt_groups"])
    first = ours(bboxes[5], scores[5], *args)
    assert solves == [24]
    if how == "pickle":
        buffer = io.BytesIO()
        torch.save(ours, buffer)
        buffer.seek(0)
        twin = torch.load(buffer, weights_only=False)
    else:
        twin = copy.deepcopy(ours)
    assert type(twin) is type(ours) and twin.variant == ours.variant and twin.cost_gain == ours.cost_gain
    assert vars(twin._peer_matcher) == vars(ours._peer_matcher)
    assert same_matches(twin(bboxes[5], scores[5], *args), first)
    assert same_matches(twin(bboxes[0], scores[0], *args), ours(bboxes[0], scores[0], *args))


def test_rtdetr_model_matches_its_seven_layers_in_one_solve(integ, solves, monkeypatch):
    """The peer's RT-DETR model stacks the encoder's and the six decoder layers' outputs: one solve for the seven, and
    the loss of one solve per layer, bit for bit."""
    from lucid_assign.integrations import _matching as core

    integ.patch()
    together = rtdetr_model_loss()
    assert solves == [7 * 3]
    solves.clear()
    monkeypatch.setattr(core, "MAX_LAYERS", 1)
    apart = rtdetr_model_loss()
    assert solves == [3] * 7
    assert torch.equal(together[0], apart[0]), (together, apart)
    assert all(torch.equal(together[1][k], apart[1][k]) for k in apart[1])


@pytest.mark.parametrize("device", devices())
def test_backend_kernel_takes_the_fast_paths_of_auto(integ, device, monkeypatch):
    """patch(backend="kernel") runs what "auto" runs where the kernel runs: the one-pass cost's check is asked for the
    kernel under both, and on CUDA both compute the stack's cost in one launch of the op and solve its layers at once,
    with the peer's matches."""
    from lucid_assign.integrations import ultralytics_detr as detr
    from ultralytics.models.utils import loss, ops

    asked = []
    fused_order = detr._fused_order
    monkeypatch.setattr(detr, "_fused_order", lambda *a: asked.append(a[-1]) or fused_order(*a))
    launches = []  # (images, queries) of each launch of the one-pass cost
    detr_cost = detr.ops.detr_cost
    monkeypatch.setattr(detr.ops, "detr_cost", lambda *a, **k: launches.append(tuple(a[0].shape[:2]))
                        or detr_cost(*a, **k))
    bboxes, scores, batch = rtdetr_loss_inputs(device)
    bboxes, scores = bboxes.detach(), scores.detach()
    args = (batch["bboxes"], batch["cls"], batch["gt_groups"])
    peer = ops.HungarianMatcher()
    for backend in ("auto", "kernel"):
        integ.patch(backend)
        ours = loss.HungarianMatcher()
        asked.clear(), launches.clear()
        for layer in (5, 0, 1):
            assert same_matches(ours(bboxes[layer], scores[layer], *args), peer(bboxes[layer], scores[layer], *args))
        assert asked == ["kernel"], (backend, asked)  # the first call costs the stack; the others are served
        if device == "cuda":  # six layers of four images in one launch (besides the device check's, at the first)
            assert [n for n in launches if n[1] == 300] == [(6 * 4, 300)], (backend, launches)
        integ.unpatch()


def test_inference_mode_tensors_are_matched_alone(integ):
    """Tensors made under torch.inference_mode track no version counter: the calls on them are matched on their own
    (the peer's matches), never an error of the layer memo."""
    from ultralytics.models.utils import loss, ops

    with torch.inference_mode():
        bboxes, scores, batch = rtdetr_loss_inputs("cpu")
    args = (batch["bboxes"], batch["cls"], batch["gt_groups"])
    peer = ops.HungarianMatcher()
    integ.patch()
    ours = loss.HungarianMatcher()
    for layer in (5, 0):
        assert same_matches(ours(bboxes[layer], scores[layer], *args), peer(bboxes[layer], scores[layer], *args))
    with torch.inference_mode():
        assert same_matches(ours(bboxes[1], scores[1], *args), peer(bboxes[1], scores[1], *args))
