"""The peer's forks: YOLOv10 (forked from ultralytics 8.1.34), YOLOv12 and YOLOv13 (8.3.63), YOLOE (8.3.39) and
YOLOv11-RGBT (8.3.75) install as `ultralytics` and carry the upstream `tal.py` of the release they forked. These
tests run the upstream releases of the two YOLOv10 bases through YOLOv10's loss, two assignments per step: the
one-to-many branch at top-k 10 and the one-to-one branch at top-k 1.

- 8.3.63 has YOLOv10 itself: `yolov10n.yaml` and its `E2EDetectLoss`.
- 8.1.34 has neither (the fork added its modules and loss): its `v8DetectionLoss` is built twice as the fork's
  `v10DetectLoss` builds it, the second with a top-k 1 assigner, over `yolov8n.yaml`'s head.

Each release: patch() takes the assigner with rule set "8.0", and in three patched training steps every call of the
CPU kernel gives what the release's own assigner gives on that call's inputs, as the contract says for the CPU (the
discrete outputs exactly, the scores to a relative 1e-6; bit for bit is the CUDA kernel's promise: the CPU's
transcendental functions round by where an element falls in a vector, so on the CPU even the reference can differ
from the peer by one unit in the last place). YOLOE's class count set at run time: in
tests/test_integration_ultralytics.py. Releases are installed by tests/peers.py (LUCID_PEER_RELEASES keeps them)."""

import json
import os
import subprocess
import sys

import pytest

from peers import install_releases

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORK_BASES = {"8.1.34": "YOLOv10's fork base", "8.3.63": "YOLOv12 and YOLOv13's fork base"}
# modules a release imports that the current peer no longer needs: installed beside it, without their dependencies
OLD_IMPORTS = {"8.1.34": ["tqdm", "pandas"], "8.3.63": ["tqdm"]}


@pytest.fixture(scope="module")
def fork_releases(tmp_path_factory):
    return install_releases(tmp_path_factory, FORK_BASES, OLD_IMPORTS)


YOLOV10 = r"""
import contextlib, json, sys, warnings
warnings.simplefilter("ignore")
import torch
from contract import assert_matches, lower_index_topk
from lucid_assign.integrations import ultralytics as integ
from ultralytics.cfg import get_cfg
from ultralytics.nn.tasks import DetectionModel
from ultralytics.utils import DEFAULT_CFG, loss as peer_loss

V10 = hasattr(peer_loss, "E2EDetectLoss")


class ForkV10Loss:
    # the fork's v10DetectLoss on a release without it: one-to-many at top-k 10, one-to-one at top-k 1
    def __init__(self, model):
        self.one2many = peer_loss.v8DetectionLoss(model)
        self.one2one = peer_loss.v8DetectionLoss(model)
        self.one2one.assigner = peer_loss.TaskAlignedAssigner(topk=1, num_classes=model.model[-1].nc, alpha=0.5,
                                                              beta=6.0)

    def __call__(self, preds, batch):
        a, b = self.one2many(preds, batch), self.one2one(preds, batch)
        return a[0] + b[0], torch.cat((a[1], b[1]))


def batch(step):
    g = torch.Generator().manual_seed(100 + step)
    n = [int(torch.randint(1, 6, (1,), generator=g)) for _ in range(2)]
    idx = torch.cat([torch.full((k,), float(b)) for b, k in enumerate(n)])
    xy = 0.15 + 0.7 * torch.rand(len(idx), 2, generator=g)
    wh = 0.03 + 0.3 * torch.rand(len(idx), 2, generator=g)
    return {"img": torch.rand(2, 3, 64, 64, generator=g), "batch_idx": idx,
            "cls": torch.randint(0, 3, (len(idx), 1), generator=g).float(), "bboxes": torch.cat((xy, wh), 1)}


def train(context, steps=3):
    torch.manual_seed(0)
    with context:
        model = DetectionModel("yolov10n.yaml" if V10 else "yolov8n.yaml", nc=3, verbose=False)
        model.args = get_cfg(DEFAULT_CFG)
        model.train()
        if not V10:
            model.criterion = ForkV10Loss(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        for step in range(steps):
            loss, _ = model.loss(batch(step))
            opt.zero_grad()
            loss.sum().backward()
            opt.step()
        crit = model.criterion
        return [crit.one2many.assigner, crit.one2one.assigner]


calls = []
forward = integ.LucidTaskAlignedAssigner.forward


def recording(self, *args):
    out = forward(self, *args)
    calls.append((self, [a.clone() for a in args], [o.clone() for o in out]))
    return out


integ.LucidTaskAlignedAssigner.forward = recording
with integ.patched("kernel"):
    lucid = train(contextlib.nullcontext())
    peer_cls = integ.STATE.original("TaskAlignedAssigner")
# every call against the release's own assigner (the oracle) on that call's inputs
for i, (a, inputs, got) in enumerate(calls):
    peer = peer_cls(topk=a.topk, num_classes=a.num_classes, alpha=a.alpha, beta=a.beta, eps=a.eps)
    with lower_index_topk("cpu"):
        want = peer(*inputs)
    assert_matches(got, want, exact=False, case=f"call {i} (topk {a.topk})")
print(json.dumps(dict(v10=V10, peer=peer_cls.__name__, lucid=[type(a).__name__ for a in lucid],
                      rules=[a.rules for a in lucid], topk=[a.topk for a in lucid], calls=len(calls),
                      fg=sum(int(got[3].sum()) for _, _, got in calls))))
"""


@pytest.mark.parametrize("version", list(FORK_BASES))
def test_yolov10s_loss_is_the_same_patched_on_each_fork_base(library, fork_releases, version):
    path = os.pathsep.join([fork_releases[version], ROOT, os.path.join(ROOT, "tests"),
                            os.environ.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", YOLOV10], env=dict(os.environ, PYTHONPATH=path),
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["v10"] == (version == "8.3.63")  # 8.1.34 has no YOLOv10 of its own
    assert got["peer"] == "TaskAlignedAssigner" and got["lucid"] == ["LucidTaskAlignedAssigner"] * 2
    assert got["rules"] == ["8.0", "8.0"] and got["topk"] == [10, 1]
    assert got["calls"] == 6 and got["fg"] > 0, got
