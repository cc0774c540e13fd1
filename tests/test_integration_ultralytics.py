"""The peer trainer patched to use lucid-assign: identical training on the CPU, and patch/unpatch hygiene.

The unpatched runs use a torch.topk that breaks ties by the lower index (CPU's own order differs; see
test_reference_vs_peer.py). The bit-identical comparison patches with backend="reference", which equals the peer on
the CPU; the CPU kernel reproduces the reference's scores to 1e-6 (SPEC.md) and is compared with a tolerance. On
CUDA the kernel itself is bit-exact (tests/test_cuda.py)."""

import os
import subprocess
import sys

import pytest
import torch

from test_reference_vs_peer import lower_index_topk

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def integ(peer_tal):
    from lucid_assign.integrations import ultralytics as integ

    yield integ
    integ.unpatch()


def _batch(step, obb):
    g = torch.Generator().manual_seed(100 + step)
    n = [int(torch.randint(1, 5, (1,), generator=g)) for _ in range(2)]
    idx = torch.cat([torch.full((k,), float(b)) for b, k in enumerate(n)])
    total = len(idx)
    xy = 0.15 + 0.7 * torch.rand(total, 2, generator=g)
    wh = 0.03 + 0.3 * torch.rand(total, 2, generator=g)  # some under the stride floor at 64 px
    boxes = torch.cat((xy, wh), 1)
    if obb:
        boxes = torch.cat((boxes, (torch.rand(total, 1, generator=g) - 0.5) * 3.0), 1)
    return {"img": torch.rand(2, 3, 64, 64, generator=g), "batch_idx": idx,
            "cls": torch.randint(0, 3, (total, 1), generator=g).float(), "bboxes": boxes}


def _train(obb, context, steps=3):
    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import DetectionModel, OBBModel
    from ultralytics.utils import DEFAULT_CFG

    torch.manual_seed(0)
    model = (OBBModel("yolo26n-obb.yaml", nc=3, verbose=False) if obb
             else DetectionModel("yolo26n.yaml", nc=3, verbose=False))
    model.args = get_cfg(DEFAULT_CFG)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    losses = []
    with context:
        for step in range(steps):
            loss, _ = model.loss(_batch(step, obb))
            opt.zero_grad()
            loss.sum().backward()
            opt.step()
            losses.append(loss.detach().clone())
        kinds = {type(a).__name__ for a in _assigners(model)}
    return losses, model.state_dict(), kinds


def _assigners(model):
    crit = model.criterion
    parts = [crit.one2many, crit.one2one] if hasattr(crit, "one2one") else [crit]
    return [p.assigner for p in parts]


@pytest.mark.parametrize("obb", [False, True], ids=["detect", "obb"])
def test_training_identical_with_and_without_patch(integ, obb):
    base, base_state, base_kinds = _train(obb, lower_index_topk("cpu"))
    ours, ours_state, ours_kinds = _train(obb, integ.patched("reference"))
    assert all(k.startswith("Lucid") for k in ours_kinds) and not any(k.startswith("Lucid") for k in base_kinds)
    for a, b in zip(base, ours):
        assert torch.equal(a, b), (a, b)
    for k in base_state:
        assert torch.equal(base_state[k], ours_state[k]), k


@pytest.mark.parametrize("obb", [False, True], ids=["detect", "obb"])
def test_training_with_the_cpu_kernel(library, integ, obb):
    base, _, _ = _train(obb, lower_index_topk("cpu"))
    ours, _, kinds = _train(obb, integ.patched("kernel"))
    assert all(k.startswith("Lucid") for k in kinds)
    for a, b in zip(base, ours):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)


def test_patch_unpatch_restore_the_peer(integ):
    from ultralytics.utils import loss

    before = (loss.TaskAlignedAssigner, loss.RotatedTaskAlignedAssigner)
    integ.patch()
    integ.patch()  # twice is harmless
    assert integ.is_patched() and loss.TaskAlignedAssigner is not before[0]
    a = loss.RotatedTaskAlignedAssigner(topk=7, num_classes=3, alpha=0.5, beta=6.0, stride=[8, 16, 32], topk2=1)
    assert (a.topk, a.topk2, a.stride_val) == (7, 1, 16)
    integ.unpatch()
    integ.unpatch()
    assert (loss.TaskAlignedAssigner, loss.RotatedTaskAlignedAssigner) == before and not integ.is_patched()
    with integ.patched():
        assert loss.TaskAlignedAssigner is not before[0]
    assert loss.TaskAlignedAssigner is before[0]


def test_unsupported_version_is_refused(integ, monkeypatch):
    import ultralytics

    monkeypatch.setattr(ultralytics, "__version__", "9.1.0")
    with pytest.raises(RuntimeError, match="9.1.0"):
        integ.patch()


def test_imports_nothing_until_called():
    code = ("import sys, lucid_assign.integrations.ultralytics as m; assert 'ultralytics' not in sys.modules; "
            "sys.modules['ultralytics'] = None\n"
            "try:\n    m.patch()\nexcept ImportError as e:\n    print('ImportError', e)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "pip install ultralytics" in out.stdout
