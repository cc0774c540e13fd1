"""torch.ops.lucid.detr_cost (docs/spec.md, "DETR matching cost"): the peer's RT-DETR matching cost in one pass,
against the patched matcher's chain of the peer's PyTorch operations (integrations.ultralytics_detr.matching_cost,
itself checked against the peer's matcher in tests/test_rtdetr.py): bit for bit on CUDA; on the CPU exactly where no
math function is involved and within a derived bound where exp and log are; its padding, NaN, errors and opcheck."""

import pytest
import torch

from conftest import devices

EPS32 = torch.finfo(torch.float32).eps


@pytest.fixture
def detr(peer_tal, library):
    from lucid_assign.integrations import ultralytics_detr

    return ultralytics_detr


def matcher(gains=(2, 5, 2), alpha=0.25, gamma=2.0):
    return type("Settings", (), dict(use_fl=True, alpha=alpha, gamma=gamma,
                                     cost_gain=dict(zip(("class", "bbox", "giou"), gains))))()


def batch(device, seed=0, groups=(0, 7, 31, 64), logit_scale=5.0, dtype=torch.float32):
    """Boxes that overlap, nest, miss and repeat, some of zero size, and an image without objects."""
    g = torch.Generator().manual_seed(seed)
    bs, nq, nc = len(groups), 64, 9
    total = sum(groups)
    pred = torch.rand(bs, nq, 4, generator=g) * 0.8 + 0.1
    pred[..., 2:] *= torch.rand(bs, nq, 1, generator=g) ** 2
    pred[1, :3, 2:] = 0.0
    gt = torch.rand(total, 4, generator=g) * 0.8 + 0.1
    if total >= 20:
        gt[1] = gt[0]
        gt[2, 3] = 0.0
        gt[10:20] = pred[2, 10:20]
    logits = (torch.rand(bs, nq, nc, generator=g) * 2 - 1) * logit_scale
    cls = torch.randint(0, nc, (total,), generator=g)
    return pred.to(device, dtype), logits.to(device, dtype), gt.to(device), cls.to(device), list(groups)


def op_cost(detr, m, pred, logits, gt, cls, groups, sanitize=True, l1_order=1):
    g = m.cost_gain
    sizes = torch.tensor(groups, device=pred.device)
    return torch.ops.lucid.detr_cost(pred, logits, gt, cls, sizes, max(groups), [g["class"], g["bbox"], g["giou"]],
                                     m.alpha, m.gamma, sanitize=sanitize, l1_order=l1_order)


def torch_cost(detr, m, pred, logits, gt, cls, groups, sanitize=True):
    variant = detr.Variant("padded", True, sanitize)
    return detr.matching_cost(m, variant, detr._peer_bbox_iou(), pred, logits, gt, cls, groups)


def test_cpu_exact_without_math_functions(detr):
    """With no class cost (gain 0) the cost is arithmetic only: the CPU op equals PyTorch's CPU operations exactly,
    padding columns included, with the L1 added in turn (PyTorch's CPU sum of four contiguous values)."""
    m = matcher(gains=(0, 5, 2))
    for seed in range(3):
        args = batch("cpu", seed)
        got, want = op_cost(detr, m, *args, l1_order=0), torch_cost(detr, m, *args)
        assert got.dtype == torch.float32 and got.shape == want.shape == (4, 64, 64)
        assert torch.equal(got, want)


def test_cpu_l1_orders(detr):
    """With only the L1 gain, l1_order 0 adds the four distances in turn and 1 as (dx + dw) + (dy + dh), each exactly
    as PyTorch's elementwise additions of the same distances; padding columns measure against the zero box."""
    m = matcher(gains=(0, 1, 0))
    pred, logits, gt, cls, groups = batch("cpu", 2)
    where = torch.tensor(groups)
    pad = torch.zeros(len(groups), max(groups), 4)
    for b, (s, n) in enumerate(zip(where.cumsum(0) - where, groups)):
        pad[b, :n] = gt[s:s + n]
    d = (pred.unsqueeze(2) - pad.unsqueeze(1)).abs().unbind(-1)
    in_turn, interleaved = ((d[0] + d[1]) + d[2]) + d[3], (d[0] + d[2]) + (d[1] + d[3])
    assert not torch.equal(in_turn, interleaved)  # the batch tells the orders apart
    assert torch.equal(op_cost(detr, m, pred, logits, gt, cls, groups, l1_order=0), in_turn)
    assert torch.equal(op_cost(detr, m, pred, logits, gt, cls, groups, l1_order=1), interleaved)


def test_cpu_class_cost_within_the_math_libraries_bound(detr):
    """The class cost uses exp and log: the CPU op takes the C library's, PyTorch's CPU kernels their vectorised
    ones; each is within 1 ulp of the true value, so they differ by at most 2 ulp. For logits in [-4, 4],
    p = sigmoid(x) lies in [s, 1 - s] with s = sigmoid(-4); a relative difference d of p (at most 4 ulp with the
    division's and addition's roundings) moves log(1 - p) by at most d / s and log(p) by d, and each log differs by
    2 ulp of its magnitude (at most -log(s)); the products and the difference of the two terms add a few ulp of
    their magnitude (at most 1). The bound: gain * (2 * (4 ulp / s + 2 ulp * -log(s)) + 8 ulp)."""
    m = matcher(gains=(2, 0, 0))
    s = torch.sigmoid(torch.tensor(-4.0, dtype=torch.float64)).item()
    ulp = EPS32
    bound = 2 * (2 * (4 * ulp / s + 2 * ulp * -torch.log(torch.tensor(s)).item()) + 8 * ulp)
    for seed in range(3):
        args = batch("cpu", seed, logit_scale=4.0)
        got, want = op_cost(detr, m, *args), torch_cost(detr, m, *args)
        assert (got - want).abs().max().item() <= bound


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
@pytest.mark.parametrize("gains,alpha,gamma", [((2, 5, 2), 0.25, 2.0), ((1, 5, 2), 0.3, 1.5), ((4, 1, 3), 0.5, 3.0)])
def test_cuda_equals_the_peers_operations_bit_for_bit(detr, dtype, gains, alpha, gamma):
    """On CUDA the op equals the peer's operations element for element (padding included), with the L1 added in
    PyTorch's CUDA order ((dx + dw) + (dy + dh), l1_order 1), for saturated logits too, and NaN where they give NaN."""
    m = matcher(gains, alpha, gamma)
    for seed in range(4):
        pred, logits, gt, cls, groups = batch("cuda", seed, logit_scale=40.0 if seed % 2 else 6.0, dtype=dtype)
        if seed == 3:
            pred[2, 5, 1] = float("nan")
        for sanitize in (True, False):
            args = (pred, logits, gt, cls, groups)
            want = torch_cost(detr, m, *args, sanitize=sanitize)
            got = op_cost(detr, m, *args, sanitize=sanitize)
            assert torch.equal(got.isnan(), want.isnan())
            assert torch.equal(got.nan_to_num(0.0), want.nan_to_num(0.0))


@pytest.mark.cuda
def test_cuda_patched_matcher_computes_the_cost_in_one_pass(detr, peer_tal):
    """The patched matcher's cost on the device equals the peer's operations, whichever way its device check chose."""
    from lucid_assign.integrations import ultralytics as integ

    try:
        integ.patch()
        from ultralytics.models.utils.loss import RTDETRDetectionLoss

        m = RTDETRDetectionLoss(nc=9).matcher
        pred, logits, gt, cls, groups = batch("cuda", 0, dtype=torch.bfloat16)
        where = detr.layout(groups, pred.shape[1], 1, pred.device)
        order = detr._fused_order(m, m.variant, pred, logits, gt, cls, groups, "kernel")
        assert torch.equal(m.cost(pred, logits, gt, cls, where, order),
                           detr.matching_cost(m, m.variant, detr._peer_bbox_iou(), pred, logits, gt, cls,
                                              groups, where))
        assert any(k[0].startswith("cuda") for k in detr._FUSED)
    finally:
        integ.unpatch()


@pytest.mark.parametrize("device", devices())
def test_nan_sanitize_and_invalid_columns(detr, device):
    """NaN boxes give NaN costs unless sanitised (then 0); a class outside [0, C) gives NaN and reads nothing; the
    inputs are not modified."""
    m = matcher()
    pred, logits, gt, cls, groups = batch(device, 1)
    pred[3, 4, 0] = float("nan")
    cls[5] = 99
    before = [t.clone() for t in (pred, logits, gt, cls)]
    raw = op_cost(detr, m, pred, logits, gt, cls, groups, sanitize=False)
    clean = op_cost(detr, m, pred, logits, gt, cls, groups, sanitize=True)
    assert raw[3, 4].isnan().all() and (clean[3, 4] == 0).all()
    column = 5 - groups[0]  # object 5 is image 1's (the first image has none)
    assert raw[1, :, column].isnan().all() and clean[1, :, column].isnan().all()
    assert not clean[1, :, column + 1].isnan().any()
    for a, b in zip(before, (pred, logits, gt, cls)):
        assert torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))


def test_errors_name_the_argument(library):
    pred, logits = torch.rand(2, 5, 4), torch.randn(2, 5, 3)
    gt, cls, sizes = torch.rand(4, 4), torch.tensor([0, 1, 2, 0]), torch.tensor([1, 3])
    op = torch.ops.lucid.detr_cost

    def call(**kw):
        args = dict(pred_bboxes=pred, pred_scores=logits, gt_bboxes=gt, gt_cls=cls, sizes=sizes, width=3,
                    gains=[2.0, 5.0, 2.0], alpha=0.25, gamma=2.0)
        args.update(kw)
        return op(**args)

    assert call().shape == (2, 5, 3)
    cases = [
        (dict(pred_scores=logits[0]), ValueError, "pred_scores must be"),
        (dict(pred_bboxes=pred[..., :3]), ValueError, "pred_bboxes must be"),
        (dict(gt_bboxes=gt[:, :2]), ValueError, "gt_bboxes must be"),
        (dict(gt_cls=cls[:2]), ValueError, "gt_cls must be"),
        (dict(sizes=sizes[:1]), ValueError, "sizes must be"),
        (dict(sizes=torch.tensor([1, 2])), ValueError, "add up to N"),
        (dict(sizes=torch.tensor([-1, 5])), ValueError, r"sizes\[0\]"),
        (dict(gt_cls=cls.float()), TypeError, "gt_cls must hold integers"),
        (dict(pred_scores=logits.long()), TypeError, "pred_scores, pred_bboxes and gt_bboxes"),
        (dict(width=-1), ValueError, "width"),
        (dict(gains=[1.0, 2.0]), ValueError, "gains"),
        (dict(gamma=float("nan")), ValueError, "gamma"),
        (dict(l1_order=2), ValueError, "l1_order"),
        (dict(sizes=sizes.to("meta")), ValueError, "one device"),
    ]
    for kw, kind, message in cases:
        with pytest.raises(kind, match=message):
            call(**kw)


def test_opcheck(library):
    pred, logits, gt, cls, groups = batch("cpu", 2, groups=(2, 0, 5))
    sizes = torch.tensor(groups)
    for args in [(pred, logits, gt, cls, sizes, 5, [2.0, 5.0, 2.0], 0.25, 2.0),
                 (pred.double(), logits.bfloat16(), gt, cls.int(), sizes, 7, [1.0, 1.0, 1.0], 0.5, 1.0)]:
        torch.library.opcheck(torch.ops.lucid.detr_cost.default, args)
