"""transformers' DETR-family matchers patched (lucid_assign.integrations.transformers): each model family built from a
tiny config (no weights, no downloads), one training loss call unpatched and one patched, the same matches and the
same loss and gradients, bit for bit; the grouped matching of LW-DETR and RF-DETR against SciPy's per-group loop."""

import numpy as np
import pytest
import torch

tf = pytest.importorskip("transformers")
pytest.importorskip("scipy")
from scipy.optimize import linear_sum_assignment  # noqa: E402

from lucid_assign.api import FallbackWarning  # noqa: E402
from lucid_assign.integrations import transformers as lt  # noqa: E402


@pytest.fixture(autouse=True)
def restored():
    lt._verified.clear()  # each test sees the classes' first call (the check is once per process)
    yield
    lt.unpatch()


def _resnet():
    return tf.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16, 16, 16], depths=[1, 1, 1, 1], layer_type="basic",
                           out_features=["stage2", "stage3", "stage4"])


def _detr_like(config_cls, model_cls, **more):
    config = config_cls(use_timm_backbone=False, backbone_config=_resnet(), use_pretrained_backbone=False,
                        encoder_layers=1, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
                        encoder_ffn_dim=16, decoder_ffn_dim=16, num_queries=12, num_labels=4, auxiliary_loss=True,
                        **more)
    return model_cls(config)


FAMILIES = {
    "DETR": (lambda: _detr_like(tf.DetrConfig, tf.DetrForObjectDetection, d_model=16), "HungarianMatcher"),
    "Conditional DETR": (lambda: _detr_like(tf.ConditionalDetrConfig, tf.ConditionalDetrForObjectDetection,
                                            d_model=16), "DeformableDetrHungarianMatcher"),
    "Deformable DETR": (lambda: _detr_like(tf.DeformableDetrConfig, tf.DeformableDetrForObjectDetection, d_model=32,
                                           encoder_n_points=2, decoder_n_points=2), "DeformableDetrHungarianMatcher"),
    "RT-DETR": (lambda: tf.RTDetrForObjectDetection(tf.RTDetrConfig(
        num_labels=4, num_queries=12, d_model=32, encoder_hidden_dim=32, decoder_in_channels=[32, 32, 32],
        decoder_layers=2, encoder_layers=1, decoder_ffn_dim=32, encoder_ffn_dim=32, num_denoising=4)),
        "RTDetrHungarianMatcher"),
    "D-FINE": (lambda: tf.DFineForObjectDetection(tf.DFineConfig(
        num_labels=4, num_queries=12, d_model=32, encoder_hidden_dim=32, decoder_in_channels=[32, 32, 32],
        decoder_layers=2, encoder_ffn_dim=32, decoder_ffn_dim=32, num_denoising=4)), "RTDetrHungarianMatcher"),
}


def _labels(counts, seed=0, duplicate=True):
    """Targets as the image processors give them (normalised cx cy w h), with an image without objects and two
    identical objects (their columns tie: only SciPy's tie rules settle them)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for k in counts:
        xy = 0.2 + 0.6 * torch.rand(k, 2, generator=g)
        wh = 0.05 + 0.3 * torch.rand(k, 2, generator=g)
        boxes, cls = torch.cat([xy, wh], 1), torch.randint(0, 4, (k,), generator=g)
        if duplicate and k >= 2:
            boxes[1], cls[1] = boxes[0], cls[0]
        out.append({"class_labels": cls, "boxes": boxes})
    return out


def _loss(model, px, labels):
    torch.manual_seed(1)  # dropout and the denoising queries draw the same numbers in both runs
    model.zero_grad(set_to_none=True)
    out = model(pixel_values=px, labels=labels)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.loss.detach(), {k: v.detach() for k, v in out.loss_dict.items()}, grads


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_family_gives_the_same_loss_patched(library, family, device, monkeypatch):
    """The CPU: the loss, its parts and the gradients, bit for bit. CUDA: every call's matches against the matcher's
    own on that call's inputs (the losses themselves are not reproducible there: DETR's class loss differs between two
    unpatched runs by a unit in the last place, and the deformable attention's backward adds with atomics)."""
    make, matcher = FAMILIES[family]
    torch.manual_seed(0)
    model = make().to(device)
    model.train()
    px = torch.rand(3, 3, 64, 64, generator=torch.Generator().manual_seed(2)).to(device)
    labels = [{k: v.to(device) for k, v in t.items()} for t in _labels([3, 0, 6])]
    plain = _loss(model, px, labels)
    if device == "cuda":  # every call checked as a first call is: against the matcher's own forward
        monkeypatch.setattr(lt, "_verified", type("EveryCall", (dict,), {"__contains__": lambda self, key: False})())
    with lt.patched("kernel"):
        assert f"{matcher}: patched" in lt.patch_report()
        ours = _loss(model, px, labels)
        cls = next(c for c in lt._originals if c.__name__ == matcher)
        assert lt._verified.get(cls) is True  # its first call (CUDA: every call) matched as the matcher's own
    if device == "cuda":
        return
    assert torch.equal(plain[0], ours[0]), (plain[0], ours[0])
    assert plain[1].keys() == ours[1].keys() and all(torch.equal(plain[1][k], ours[1][k]) for k in plain[1])
    assert plain[2].keys() == ours[2].keys() and all(torch.equal(plain[2][k], ours[2][k]) for k in plain[2])


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
    monkeypatch.setattr(lt, "match", lambda cost, sizes, groups=1, backend="auto": [
        (torch.arange(min(n, cost.shape[1]) - 1, -1, -1), torch.arange(min(n, cost.shape[1])))
        for n in sizes])
    make, matcher = FAMILIES["DETR"]
    torch.manual_seed(0)
    model = make()
    model.train()
    px, labels = torch.rand(2, 3, 64, 64), _labels([3, 4])
    plain = _loss(model, px, labels)
    with lt.patched():
        with pytest.warns(FallbackWarning, match=f"the patched {matcher} matched differently"):
            ours = _loss(model, px, labels)
        assert f"{matcher}: left to transformers (its first call matched differently)" in lt.patch_report()
    assert torch.equal(plain[0], ours[0])


def test_patch_refuses_an_unknown_backend():
    with pytest.raises(ValueError, match="backend"):
        lt.patch("fast")
