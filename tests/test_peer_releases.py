"""The rule sets (docs/spec.md, "Rule sets") against one release of each group of the peer (docs/releases.md).

Each release is installed without its dependencies into a folder of its own (pip install --no-deps --target; the
dependencies are those of the peer installed here) and used in a subprocess with that folder first on sys.path:
scripts/peer_rules.py finds the rule set of each assigner class (patch()'s own check, on adversarial batches), then
patch() and unpatch() run against the release, and a real patched ``YOLO(...).train()`` step runs for the releases of
the YOLOv8 era. The kernels give the reference's results under every rule set (tests below, CPU and CUDA).

LUCID_PEER_RELEASES: a folder that keeps the installed releases between runs (default: a temporary one)."""

import json
import os
import subprocess
import sys

import pytest
import torch

from lucid_assign import api, reference
from lucid_assign.synthetic import check_batch, pose_batch, seg_batch, write_yolo_dataset

from contract import CPU_SCORE_RTOL, assert_matches, pose_score_rtol
from peers import install_releases

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEYS = reference.INPUTS
# One release of each group, and the rule set the survey measured for each of its assigner classes.
RELEASES = {
    "8.3.228": {"TaskAlignedAssigner": "8.0", "RotatedTaskAlignedAssigner": "8.0"},
    # 8.4.0's axis-aligned rules are those of 8.4.8 (the newest rule set that fits is named)
    "8.4.0": {"TaskAlignedAssigner": "8.4.8", "RotatedTaskAlignedAssigner": "8.4.0"},
    "8.4.100": {"TaskAlignedAssigner": "8.4.8", "RotatedTaskAlignedAssigner": "8.4.8"},
    # CIoU's rounding (8.4.128 -> 8.4.144) does not reach oriented boxes
    "8.4.140": {"TaskAlignedAssigner": "8.4.128", "RotatedTaskAlignedAssigner": "8.4.144"},
    # the first pose assigner (8.4.180-8.4.186): no level gate, the mean of CIoU and OKS
    "8.4.180": {"TaskAlignedAssigner": "8.4.144", "RotatedTaskAlignedAssigner": "8.4.144",
                "PoseTaskAlignedAssigner": "8.4.180"},
}

# One release of each group of the RT-DETR matcher (docs/releases.md) and the cost variant patch() finds for it.
MATCHER_RELEASES = {
    "8.3.228": "flat cost, non-finite costs to 0",
    "8.4.150": "padded cost, non-finite costs to 0",
    "8.4.180": "padded cost, widened to float32, non-finite costs to 0",
}


@pytest.fixture(scope="module")
def releases(tmp_path_factory):
    """Install each release of RELEASES (once per folder); skip, or fail with LUCID_REQUIRE_PEER=1, without pip's
    registry."""
    return install_releases(tmp_path_factory, {**RELEASES, **MATCHER_RELEASES})


def _run(release_dir, code, timeout=600):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([release_dir, ROOT, os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


@pytest.mark.parametrize("version", list(RELEASES))
def test_each_group_has_its_rule_set(releases, version):
    cache = os.path.dirname(releases[version])
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "peer_rules.py"), "--json", "--cache", cache,
                          version], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)[version]
    assert {name: rules for name, (rules, _) in result["classes"].items()} == RELEASES[version], result


PATCH = """
import json, warnings
warnings.simplefilter("ignore")
from lucid_assign.integrations import ultralytics as integ
from lucid_assign.integrations._peer import NAMES
from ultralytics.utils import loss
before = {n: getattr(loss, n, None) for n in NAMES}
integ.patch()
a = loss.TaskAlignedAssigner(10, 3, 0.5, 6.0, *ARGS)
r = loss.RotatedTaskAlignedAssigner(topk=10, num_classes=3, alpha=0.5, beta=6.0)
print(json.dumps(dict(types=[type(a).__name__, type(r).__name__], rules=[a.rules, r.rules], eps=a.eps,
                      report=integ.patch_report())))
integ.unpatch()
assert {n: getattr(loss, n, None) for n in NAMES} == before
"""


@pytest.mark.parametrize("version", list(RELEASES))
def test_patch_takes_the_releases_constructor_and_unpatch_restores_it(library, releases, version):
    """8.3's constructor takes eps fifth; 8.4's takes stride fifth. The patched classes take the release's own."""
    args = "[1e-7]" if version.startswith("8.3") else "[[8, 16, 32], 1e-7]"
    got = json.loads(_run(releases[version], PATCH.replace("*ARGS", "*" + args)).splitlines()[-1])
    assert got["types"] == ["LucidTaskAlignedAssigner", "LucidRotatedTaskAlignedAssigner"]
    assert got["rules"] == [RELEASES[version]["TaskAlignedAssigner"],
                            RELEASES[version]["RotatedTaskAlignedAssigner"]]
    assert got["eps"] == 1e-7
    assert all(line.endswith(")") and "patched" in line for line in got["report"]), got["report"]


MATCHER = """
import json, warnings
warnings.simplefilter("ignore")
import torch
from lucid_assign.integrations import ultralytics as integ
from ultralytics.models.utils.loss import RTDETRDetectionLoss

def losses():
    g = torch.Generator().manual_seed(0)
    groups, nq, nc = [7, 0, 30, 2], 300, 80
    total = sum(groups)
    gt = torch.cat((0.15 + 0.7 * torch.rand(total, 2, generator=g), 0.02 + 0.3 * torch.rand(total, 2, generator=g)), 1)
    gt[1] = gt[0]
    cls = torch.randint(0, nc, (total,), generator=g)
    cls[1] = cls[0]
    boxes = torch.rand(6, len(groups), nq, 4, generator=g).clamp(0.02, 0.98).requires_grad_()
    scores = (torch.randn(6, len(groups), nq, nc, generator=g) * 2).requires_grad_()
    out = RTDETRDetectionLoss(nc=nc, use_vfl=True)((boxes, scores), {"cls": cls, "bboxes": gt, "gt_groups": groups})
    sum(out.values()).backward()
    grads = boxes.grad.flatten().tolist()[:4000] + scores.grad.flatten().tolist()[:4000]
    return [v.item() for v in out.values()] + grads

plain = losses()
integ.patch()
patched = losses()
from ultralytics.models.utils import loss
print(json.dumps(dict(report=[r for r in integ.patch_report() if r.startswith("HungarianMatcher")],
                      matcher=loss.HungarianMatcher.__name__, same=plain == patched)))
"""


@pytest.mark.parametrize("version", list(MATCHER_RELEASES))
def test_each_matcher_group_is_patched_with_its_variant_and_gives_the_same_loss(library, releases, version):
    """The RT-DETR matcher of each group of releases: patch() finds its cost variant, and the release's loss and
    gradients are the same, patched and unpatched."""
    got = json.loads(_run(releases[version], MATCHER).splitlines()[-1])
    assert got["report"] == [f"HungarianMatcher: patched ({MATCHER_RELEASES[version]})"]
    assert got["matcher"] == "LucidHungarianMatcher" and got["same"]


TRAIN = """
import sys, warnings
warnings.simplefilter("ignore")
from lucid_assign.integrations import ultralytics as integ
from ultralytics import YOLO
integ.patch()
obb = sys.argv[1] == "obb"
model = YOLO("yolov8n-obb.yaml" if obb else "yolov8n.yaml")
model.train(data=sys.argv[2], project=sys.argv[3], name="run", epochs=1, imgsz=64, batch=2, workers=0, plots=False,
            device="cpu", amp=False, exist_ok=True, verbose=False, val=False)
print(type(model.trainer.model.criterion.assigner).__name__, model.trainer.model.criterion.assigner.rules)
"""


@pytest.mark.parametrize("obb", [False, True], ids=["detect", "obb"])
def test_a_yolov8_era_release_trains_with_lucid_assign(library, releases, tmp_path, obb):
    data = write_yolo_dataset(tmp_path / "data", images=4, obb=obb)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([releases["8.3.228"], ROOT, os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", TRAIN, "obb" if obb else "detect", str(data), str(tmp_path / "runs")],
                         env=env, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    name = "LucidRotatedTaskAlignedAssigner" if obb else "LucidTaskAlignedAssigner"
    assert out.stdout.strip().splitlines()[-1] == f"{name} 8.0"


def _batches():
    for obb in (False, True):
        b = check_batch(obb)
        yield ("obb" if obb else "hbb"), [b[k] for k in KEYS], {}, None
    p = pose_batch(batch=2, img_size=128, num_classes=5, objects=(6, 16), seed=3)
    yield "pose", [p[k] for k in KEYS], dict(anc_strides=p["anc_strides"], pd_kpts=p["pd_kpts"],
                                             gt_kpts=p["gt_kpts"], sigmas=p["sigmas"]), "pose"
    s = seg_batch(batch=2, img_size=128, num_classes=5, objects=(6, 16), mask_dim=8, seed=3)
    yield "seg", [s[k] for k in KEYS], {k: s[k] for k in ("pd_coef", "mask_scale", "proto", "gt_masks")}, "seg"


def _assign(backend, inputs, extra, kind, **kw):
    if kind == "pose":
        return api.assign_pose(*inputs, *extra.values(), backend=backend, **kw)
    if kind == "seg":
        return api.assign_seg(*inputs, *extra.values(), backend=backend, **kw)
    return api.assign(*inputs, backend=backend, **kw)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("rules", reference.RULE_SETS)
def test_the_kernels_follow_each_rule_set(library, rules, device):
    """Every task under every rule set: the kernel gives the reference's results (CUDA: bit for bit; CPU: discrete
    outputs exactly, scores to the CPU contract: contract.py)."""
    for name, inputs, extra, kind in _batches():
        inputs = [t.to(device) for t in inputs]
        extra = {k: v.to(device) for k, v in extra.items()}
        kw = dict(topk=10, num_classes=5, alpha=0.5, beta=6.0, stride=[8, 16, 32], rules=rules)
        want = _assign("reference", inputs, extra, kind, **kw)
        got = _assign("kernel", inputs, extra, kind, **kw)
        rtol = pose_score_rtol(extra["gt_kpts"].shape[2]) if kind == "pose" else CPU_SCORE_RTOL
        assert_matches(got, want, device == "cuda", f"{name} {rules}", rtol=rtol)


def test_the_rule_sets_differ_where_the_releases_do():
    """On the check batches each rule set assigns differently from the next one (the floor, the CIoU's rounding)."""
    for obb in (False, True):
        b = check_batch(obb)
        inputs = [b[k] for k in KEYS]
        outs = {r: reference.assign(*inputs, topk=10, num_classes=5, alpha=0.5, beta=6.0, rules=r)
                for r in reference.RULE_SETS}
        differ = [not all(torch.equal(x, y) for x, y in zip(outs[r], outs[s]))
                  for r, s in zip(reference.RULE_SETS, reference.RULE_SETS[1:])]
        # HBB: 8.4.0 and 8.4.8 floor axis-aligned boxes alike; OBB: 8.0 and 8.4.0 test oriented boxes alike (no
        # floor), and CIoU's rounding does not reach them; 8.4.180 differs from 8.4.144 in pose alone
        assert differ == ([False, True, True, False, False] if obb else [True, False, True, True, False]), (obb, differ)
    _, inputs, extra, _ = next(b for b in _batches() if b[0] == "pose")
    outs = {r: reference.assign_pose(*inputs, *extra.values(), topk=10, num_classes=5, alpha=0.5, beta=6.0, rules=r)
            for r in ("8.4.144", "8.4.180")}
    assert not torch.equal(outs["8.4.144"][2], outs["8.4.180"][2])


def test_unknown_rules_and_a_second_topk_under_8_0_are_refused():
    b = check_batch(False)
    inputs = [b[k] for k in KEYS]
    with pytest.raises(ValueError, match="rules must be one of"):
        reference.assign(*inputs, num_classes=5, rules="8.5")
    with pytest.raises(ValueError, match="no second top-k"):
        api.assign(*inputs, num_classes=5, topk=10, topk2=1, rules="8.0", backend="reference")


CUDA_PARITY = """
import inspect, json, sys, warnings
warnings.simplefilter("ignore")
import torch
from lucid_assign import api
from lucid_assign.integrations import ultralytics as integ
from lucid_assign.synthetic import check_batch, dota_like_batch, pose_batch
rules = json.loads(sys.argv[1])
tal = integ._peer().tal
bad = []
for name, obb in (("TaskAlignedAssigner", False), ("RotatedTaskAlignedAssigner", True)):
    batches = [check_batch(obb)] + [dota_like_batch(batch=4, img_size=640, num_classes=15, objects=(50, 400), obb=obb,
                                                    seed=s) for s in range(3)]
    for b in batches:
        x = [b[k].cuda() for k in ("pd_scores", "pd_bboxes", "anc_points", "gt_labels", "gt_bboxes", "mask_gt")]
        cls = getattr(tal, name)
        for topk, topk2 in ((10, None), (7, 1)):
            kw = integ._accepted(cls, dict(topk=topk, topk2=topk2, num_classes=x[0].shape[-1], alpha=0.5, beta=6.0,
                                           stride=[8, 16, 32]))
            if topk2 is not None and "topk2" not in kw:
                continue
            theirs = cls(**kw)(*(t.clone() for t in x))
            ours = api.assign(*x, backend="kernel", rules=rules[name], **dict(kw, stride=[8, 16, 32]))
            bad += [f"{name} topk2={topk2} output {i}" for i, (a, t) in enumerate(zip(ours, theirs))
                    if not torch.equal(a.to(t.dtype), t)]
if "PoseTaskAlignedAssigner" in rules:
    cls = tal.PoseTaskAlignedAssigner
    strides = "anc_strides" in inspect.signature(cls.forward).parameters  # 8.4.187 on
    for seed in range(3):
        b = pose_batch(batch=4, img_size=320, objects=(2, 30), seed=seed, device="cuda")
        x = [b[k] for k in ("pd_scores", "pd_bboxes", "anc_points", "gt_labels", "gt_bboxes", "mask_gt")]
        for topk, topk2 in ((10, None), (7, 1)):
            kw = dict(topk=topk, topk2=topk2, num_classes=1, alpha=0.5, beta=6.0, stride=[8, 16, 32])
            theirs = cls(b["sigmas"], **kw)(*(t.clone() for t in x), *([b["anc_strides"]] if strides else []),
                                            pd_kpts=b["pd_kpts"], gt_kpts=b["gt_kpts"])
            ours = api.assign_pose(*x, b["anc_strides"], b["pd_kpts"], b["gt_kpts"], b["sigmas"], backend="kernel",
                                   rules=rules["PoseTaskAlignedAssigner"], **kw)
            bad += [f"pose seed={seed} topk2={topk2} output {i}" for i, (a, t) in enumerate(zip(ours, theirs))
                    if not torch.equal(a.to(t.dtype), t)]
print(json.dumps(bad))
"""


@pytest.mark.cuda
@pytest.mark.parametrize("version", list(RELEASES))
def test_each_group_bit_for_bit_on_cuda(library, releases, version):
    """The peer release on CUDA (its own torch.topk, which ties to the lower index there) and the CUDA kernel with
    the release's rule set: every output equal bit for bit, on the check batches and on DOTA-like batches."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([releases[version], ROOT, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", CUDA_PARITY, json.dumps(RELEASES[version])], env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [], version
