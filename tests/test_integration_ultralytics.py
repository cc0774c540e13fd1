"""The peer trainer patched to use lucid-assign: identical training on the CPU, what the patch promises when the
kernel cannot run or the peer differs, and patch/unpatch hygiene.

The unpatched runs use a torch.topk that breaks ties by the lower index (CPU's own order differs; see
test_reference_vs_peer.py). The bit-identical training comparison patches with backend="reference", which equals the
peer on the CPU. The CPU kernel's promise is per assignment (the reference's discrete outputs exactly, its scores to
a relative 1e-6), so training with it is checked call by call against the reference on that call's own inputs: a
1e-6 difference in the scores can grow over training steps into loss differences no tolerance derives from. On CUDA
the kernel itself is bit-exact (tests/test_cuda.py)."""

import logging
import os
import subprocess
import sys
import threading

import pytest
import torch

from lucid_assign import reference
from lucid_assign.integrations._peer import NAMES

from contract import assert_matches, lower_index_topk, pose_score_rtol

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def integ(peer_tal):
    from lucid_assign.integrations import ultralytics as integ

    yield integ
    integ.unpatch()


def _batch(step, obb):
    """obb: True (oriented boxes), False (boxes), "pose" (boxes and 17 keypoints, some invisible) or "seg" (boxes and
    masks: per image a 16 x 16 map of 1 + the object drawn at each pixel, the larger first, as the peer's loader gives
    them with overlap_mask, and the pixels' classes)."""
    g = torch.Generator().manual_seed(100 + step)
    n = [int(torch.randint(1, 5, (1,), generator=g)) for _ in range(2)]
    idx = torch.cat([torch.full((k,), float(b)) for b, k in enumerate(n)])
    total = len(idx)
    xy = 0.15 + 0.7 * torch.rand(total, 2, generator=g)
    wh = 0.03 + 0.3 * torch.rand(total, 2, generator=g)  # some under the stride floor at 64 px
    boxes = torch.cat((xy, wh), 1)
    if obb is True:
        boxes = torch.cat((boxes, (torch.rand(total, 1, generator=g) - 0.5) * 3.0), 1)
    batch = {"img": torch.rand(2, 3, 64, 64, generator=g), "batch_idx": idx,
             "cls": torch.randint(0, 3, (total, 1), generator=g).float(), "bboxes": boxes}
    if obb == "pose":
        kxy = xy[:, None] + (torch.rand(total, 17, 2, generator=g) - 0.5) * wh[:, None]
        vis = (torch.rand(total, 17, 1, generator=g) < 0.7).float() * 2
        vis[0] = 0  # an object without visible keypoints keeps the box overlap
        batch["keypoints"] = torch.cat((kxy * (vis > 0), vis), -1)
    if obb == "seg":
        centre = (torch.arange(16) + 0.5) / 16
        masks, sem = torch.zeros(2, 16, 16), torch.zeros(2, 16, 16, dtype=torch.long)
        for i in (wh.prod(1)).argsort(descending=True).tolist():
            b, k = int(idx[i]), i - sum(n[: int(idx[i])])
            inside = (((centre[None] - xy[i, 0]) / wh[i, 0] * 2) ** 2
                      + ((centre[:, None] - xy[i, 1]) / wh[i, 1] * 2) ** 2)
            masks[b][inside <= 1] = k + 1
            sem[b][inside <= 1] = int(batch["cls"][i])
        batch["masks"], batch["sem_masks"] = masks, sem
    return batch


def _train(obb, context, steps=3):
    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import DetectionModel, OBBModel, PoseModel, SegmentationModel
    from ultralytics.utils import DEFAULT_CFG

    torch.manual_seed(0)
    if obb == "pose":
        model = PoseModel("yolo26n-pose.yaml", nc=3, data_kpt_shape=(17, 3), verbose=False)
    elif obb == "seg":
        model = SegmentationModel("yolo26n-seg.yaml", nc=3, verbose=False)
    else:
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


@pytest.mark.parametrize("obb", [False, True, "pose", "seg"], ids=["detect", "obb", "pose", "seg"])
def test_training_identical_with_and_without_patch(integ, obb):
    base, base_state, base_kinds = _train(obb, lower_index_topk("cpu"))
    ours, ours_state, ours_kinds = _train(obb, integ.patched("reference"))
    assert all(k.startswith("Lucid") for k in ours_kinds) and not any(k.startswith("Lucid") for k in base_kinds)
    for a, b in zip(base, ours):
        assert torch.equal(a, b), (a, b)
    for k in base_state:
        assert torch.equal(base_state[k], ours_state[k]), k


@pytest.mark.parametrize("obb", [False, True, "pose", "seg"], ids=["detect", "obb", "pose", "seg"])
def test_training_with_the_cpu_kernel(library, integ, obb, monkeypatch):
    """Each assignment of three training steps (two per step: YOLO26's one-to-many and one-to-one) against the
    reference on that call's inputs."""

    calls = []

    def recording(forward):
        def call(self, *args, **extra):
            out = forward(self, *args, **extra)
            calls.append((self, [a.clone() for a in args], {k: v.clone() for k, v in extra.items()},
                          [o.clone() for o in out]))
            return out

        return call

    for cls in (integ.LucidTaskAlignedAssigner, integ.LucidRotatedTaskAlignedAssigner,
                integ.LucidPoseTaskAlignedAssigner, integ.LucidSegTaskAlignedAssigner):
        monkeypatch.setattr(cls, "forward", recording(cls.forward))
    _, _, kinds = _train(obb, integ.patched("kernel"))
    assert all(k.startswith("Lucid") for k in kinds)
    assert len(calls) == 6
    for i, (assigner, inputs, extra, got) in enumerate(calls):
        kw = dict(topk=assigner.topk, topk2=assigner.topk2, num_classes=assigner.num_classes, alpha=assigner.alpha,
                  beta=assigner.beta, eps=assigner.eps, stride=assigner.stride)
        if obb == "pose":
            assert set(extra) == {"anc_strides", "pd_kpts", "gt_kpts"}  # the pose loss passes them by name
            want = reference.assign_pose(*inputs, extra["anc_strides"], extra["pd_kpts"], extra["gt_kpts"],
                                         assigner.sigmas, **kw)
            assert_matches(got, want, exact=False, case=f"call {i} (topk {assigner.topk})", rtol=pose_score_rtol(17))
        elif obb == "seg":
            assert set(extra) == {"pd_coef", "mask_scale", "proto", "gt_masks"}  # the seg loss passes them by name
            want = reference.assign_seg(*inputs, *(extra[k] for k in ("pd_coef", "mask_scale", "proto", "gt_masks")),
                                        **kw)
            assert_matches(got, want, exact=False, case=f"call {i} (topk {assigner.topk})")
        else:
            want = reference.assign(*inputs, **kw)
            assert_matches(got, want, exact=False, case=f"call {i} (topk {assigner.topk})")


def test_patch_unpatch_restore_the_peer(integ):
    from ultralytics.utils import dist, loss

    before = (loss.TaskAlignedAssigner, loss.RotatedTaskAlignedAssigner, dist.generate_ddp_file,
              loss.PoseTaskAlignedAssigner, loss.SegTaskAlignedAssigner)
    integ.patch()
    integ.patch()  # twice is harmless
    assert integ.is_patched() and loss.TaskAlignedAssigner is integ.LucidTaskAlignedAssigner
    assert loss.PoseTaskAlignedAssigner is integ.LucidPoseTaskAlignedAssigner
    assert loss.SegTaskAlignedAssigner is integ.LucidSegTaskAlignedAssigner
    s = loss.SegTaskAlignedAssigner(topk=7, num_classes=3, alpha=0.5, beta=6.0, stride=[8, 16, 32], topk2=1)
    assert (s.topk, s.topk2, s.backend) == (7, 1, "auto") and type(s.peer()) is before[4]
    sigmas = torch.full((17,), 0.05)
    p = loss.PoseTaskAlignedAssigner(sigmas, topk=7, num_classes=3, alpha=0.5, beta=6.0, stride=[8, 16, 32], topk2=1)
    assert (p.topk, p.topk2, p.sigmas is sigmas, p.backend) == (7, 1, True, "auto")
    assert p.peer().sigmas is sigmas and type(p.peer()) is before[3]
    assert dist.generate_ddp_file is not before[2] and dist.generate_ddp_file.__wrapped__ is before[2]
    a = loss.RotatedTaskAlignedAssigner(topk=7, num_classes=3, alpha=0.5, beta=6.0, stride=[8, 16, 32], topk2=1)
    assert (a.topk, a.topk2, a.stride_val, a.backend) == (7, 1, 16, "auto")
    integ.patch("reference")
    assert loss.TaskAlignedAssigner(num_classes=3).backend == "reference"
    integ.unpatch()
    integ.unpatch()
    assert (loss.TaskAlignedAssigner, loss.RotatedTaskAlignedAssigner, dist.generate_ddp_file,
            loss.PoseTaskAlignedAssigner, loss.SegTaskAlignedAssigner) == before
    assert not integ.is_patched()
    with integ.patched():
        assert loss.TaskAlignedAssigner is not before[0]
    assert loss.TaskAlignedAssigner is before[0]


def test_patch_refuses_an_unknown_backend(integ):
    with pytest.raises(ValueError, match="backend"):
        integ.patch("fast")
    assert not integ.is_patched()


def test_the_self_check_passes_against_the_installed_peer(integ, peer_tal):
    assert integ.self_check(peer_tal) is None


def test_the_self_check_changes_topk_in_its_own_thread_only(integ, peer_tal, monkeypatch):
    """While the peer's assigner runs for the self-check, its top-k breaks ties to the lower index in that thread, and
    torch, the peer's module and every other thread keep torch's own top-k."""
    method, ties = torch.Tensor.topk, torch.zeros(1, 6)
    native = {}
    thread = threading.Thread(target=lambda: native.update(idx=ties.topk(3).indices))
    thread.start()
    thread.join()
    seen = []
    forward = peer_tal.TaskAlignedAssigner.forward

    def spy(self, *args, **kwargs):
        other = {}
        thread = threading.Thread(target=lambda: other.update(idx=ties.topk(3).indices))
        thread.start()
        thread.join()
        seen.append((torch.Tensor.topk is method, peer_tal.torch is torch, torch.equal(other["idx"], native["idx"]),
                     ties.topk(3).indices.tolist()))
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(peer_tal.TaskAlignedAssigner, "forward", spy)
    integ.check_peer(peer_tal)
    assert seen and all(s == (True, True, True, [[0, 1, 2]]) for s in seen), seen


def test_the_check_batch_reaches_every_rare_rule():
    """synthetic.check_batch must exercise what a changed peer would most likely change: conflicts, conflicts won by
    an object that did not claim the anchor, the zero fill of the top-k, padding rows and tiny objects; for both
    box kinds and both top-k settings of the self-check."""
    from lucid_assign.synthetic import check_batch

    for obb in (False, True):
        b = check_batch(obb)
        scores, pd, anc, labels, gt, mask = (b[k] for k in ("pd_scores", "pd_bboxes", "anc_points", "gt_labels",
                                                            "gt_bboxes", "mask_gt"))
        valid = mask.bool()
        inside = reference.points_in_boxes(anc, gt, mask, reference.stride_value(b["stride"]))
        align, ov = reference.box_metrics(scores, pd, labels, gt, inside & valid, 0.5, 6.0)
        side = gt[..., 2] if obb else torch.minimum(gt[..., 2] - gt[..., 0], gt[..., 3] - gt[..., 1])
        for topk in (10, 7):
            pos = reference.topk_mask(align, topk) & inside & valid
            resolved = reference.resolve_conflicts(pos, ov)
            assert (pos.sum(1) > 1).any(), (obb, topk, "no conflict")
            assert (resolved & ~pos).any(), (obb, topk, "no conflict won by an object that did not claim it")
            assert (pos & (align == 0)).any(), (obb, topk, "no zero fill")
            assert (pos & ((side < 16) & valid[..., 0])[..., None]).any(), (obb, topk, "no tiny object positive")
        assert (~valid).any() and (scores == 0).any()


def _alter(monkeypatch, tal, name, change):
    """Change one method of the peer's TaskAlignedAssigner (and so of its rotated subclass) on purpose."""
    original = getattr(tal.TaskAlignedAssigner, name)
    monkeypatch.setattr(tal.TaskAlignedAssigner, name, lambda self, *a, **k: change(original, self, *a, **k))


ALTERED = {
    # a conflict among the claimants only (what simple versions do; docs/spec.md, conflicts look at every row)
    "conflicts": ("select_highest_overlaps", lambda f, s, mask_pos, ov, n, align: f(s, mask_pos, ov * mask_pos, n,
                                                                                    align)),
    # a top-k that drops zero-metric candidates (the zero fill)
    "zero fill": ("select_topk_candidates", lambda f, s, metrics, topk_mask=None: f(s, metrics, None)),
    # an alignment metric that changed its rounding
    "metric": ("get_box_metrics", lambda f, s, *a, **k: (lambda am, ov: (am * (1 + 2**-20), ov))(*f(s, *a, **k))),
}


@pytest.mark.parametrize("change", ["conflicts", "zero fill"])
def test_patch_leaves_an_assigner_that_assigns_differently_to_the_peer(integ, peer_tal, monkeypatch, change):
    """An assigner that no rule set reproduces stays the peer's, said once with the reason; patch() does not raise
    while another assigner of the release can be patched."""
    from ultralytics.utils import loss

    name, fn = ALTERED[change]
    _alter(monkeypatch, peer_tal, name, fn)
    diff = integ.self_check(peer_tal)
    assert diff is not None
    left = [n for n in NAMES if n in diff]
    monkeypatch.setattr(integ.STATE, "said", set())
    with pytest.warns(integ.FallbackWarning, match="is left to ultralytics"):
        integ.patch()
    assert left and all(getattr(loss, n) is getattr(peer_tal, n) for n in left)
    assert [line.split(":")[0] for line in integ.patch_report() if "left to ultralytics" in line] == left


def test_patch_refuses_a_peer_none_of_whose_assigners_it_reproduces(integ, peer_tal, monkeypatch):
    """A metric rounded otherwise reaches every assigner class (all derive from TaskAlignedAssigner)."""
    from ultralytics.utils import loss

    name, fn = ALTERED["metric"]
    _alter(monkeypatch, peer_tal, name, fn)
    with pytest.raises(integ.PeerMismatchError, match="nothing to patch"):
        integ.patch()
    assert not integ.is_patched() and loss.TaskAlignedAssigner is peer_tal.TaskAlignedAssigner


def test_a_call_the_kernel_cannot_take_goes_to_the_peer_with_a_warning(integ, peer_tal, library, monkeypatch):
    """backend auto: float64 boxes with float32 scores are not a kernel's dtypes; the call runs the peer's own
    assigner (its results, its speed), and that is said once, with the reason and the fix."""
    import warnings

    from cases import make_problem

    monkeypatch.setattr(integ.STATE, "said", set())
    monkeypatch.delenv("LUCID_ASSIGN_BACKEND", raising=False)
    inputs = list(make_problem(3, obb=True, num_classes=7))
    inputs[1], inputs[4] = inputs[1].double(), inputs[4].double()  # float64 boxes, float32 scores
    integ.patch()
    from ultralytics.utils import loss

    kw = dict(topk=10, num_classes=7, alpha=0.5, beta=6.0, stride=[8, 16, 32])
    ours = loss.RotatedTaskAlignedAssigner(**kw)
    ran = _count_calls(monkeypatch, peer_tal.RotatedTaskAlignedAssigner)
    with pytest.warns(integ.FallbackWarning,
                      match=r"cannot run its kernel here \(.*float64.*\).*Fix: pass pd_scores as torch.float64"):
        got = ours(*inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per reason
        ours(*inputs)
    assert ran == [1, 1]
    with lower_index_topk("cpu"):
        got = ours(*inputs)
        want = peer_tal.RotatedTaskAlignedAssigner(**kw)(*inputs)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    strict = loss.RotatedTaskAlignedAssigner(backend="kernel", **kw)
    with pytest.raises(RuntimeError, match="backend='kernel' cannot run"):
        strict(*inputs)


def test_patch_leaves_a_pose_assigner_whose_gate_differs_to_the_peer(integ, peer_tal, monkeypatch):
    from ultralytics.utils import loss

    monkeypatch.setattr(peer_tal.PoseTaskAlignedAssigner, "level_range", (2.0, 10.0))
    assert "PoseTaskAlignedAssigner" in (integ.self_check(peer_tal) or "")
    monkeypatch.setattr(integ.STATE, "said", set())
    with pytest.warns(integ.FallbackWarning, match="PoseTaskAlignedAssigner is left to ultralytics"):
        integ.patch()
    assert loss.PoseTaskAlignedAssigner is peer_tal.PoseTaskAlignedAssigner
    assert loss.TaskAlignedAssigner is integ.LucidTaskAlignedAssigner


def _count_calls(monkeypatch, cls) -> list:
    """A list that grows by one each time the peer's class ``cls`` assigns (its forward runs)."""
    ran, forward = [], cls.forward

    def counted(self, *args, **kwargs):
        ran.append(1)
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(cls, "forward", counted)
    return ran


def test_a_pose_call_the_kernel_cannot_take_goes_to_the_peer(integ, peer_tal, library, monkeypatch):
    """64 keypoints per object: more than the kernels take; the call runs the peer's own pose assigner, said once."""
    from cases import pose_problem as problem

    monkeypatch.setattr(integ.STATE, "said", set())
    monkeypatch.delenv("LUCID_ASSIGN_BACKEND", raising=False)
    inputs = problem(20, keypoints=64)
    integ.patch()
    from ultralytics.utils import loss

    kw = dict(topk=10, num_classes=3, alpha=0.5, beta=6.0, stride=[8, 16, 32])
    ours = loss.PoseTaskAlignedAssigner(inputs[9], **kw)
    ran = _count_calls(monkeypatch, peer_tal.PoseTaskAlignedAssigner)
    with pytest.warns(integ.FallbackWarning, match=r"cannot run its kernel here \(.*at most 63"):
        ours(*inputs[:7], pd_kpts=inputs[7], gt_kpts=inputs[8])
    assert ran == [1]
    with lower_index_topk("cpu"):
        got = ours(*inputs[:7], pd_kpts=inputs[7], gt_kpts=inputs[8])
        want = peer_tal.PoseTaskAlignedAssigner(inputs[9], **kw)(*inputs[:7], pd_kpts=inputs[7], gt_kpts=inputs[8])
    assert ran == [1, 1, 1]
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_without_the_library_patch_says_so_and_kernel_refuses(peer_tal):
    """The compiled library not loaded: patch() warns with the fix and the calls go to the peer (training as
    unpatched); patch(backend="kernel") raises."""
    code = (
        "import warnings, torch\n"
        "from lucid_assign.integrations import ultralytics as m\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    m.patch()\n"
        "print('WARNED', [str(x.message) for x in w if issubclass(x.category, m.FallbackWarning)])\n"
        "from ultralytics.utils import loss\n"
        "a = loss.TaskAlignedAssigner(num_classes=3)\n"
        "import sys; sys.path.insert(0, 'tests'); from cases import make_problem\n"
        "with warnings.catch_warnings():\n"
        "    warnings.simplefilter('ignore')\n"
        "    out = a(*make_problem(0, False, num_classes=3))\n"
        "print('RAN', type(a.peer()).__module__, int(out[3].sum()))\n"
        "m.unpatch()\n"
        "try:\n    m.patch('kernel')\nexcept RuntimeError as e:\n    print('REFUSED', e)\n"
    )
    env = dict(os.environ, LUCID_ASSIGN_DISABLE_EXT="1", YOLO_OFFLINE="1")
    env.pop("LUCID_ASSIGN_BACKEND", None)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    warned = out.stdout.split("WARNED")[1].split("\n")[0]
    assert "lucid-assign: the compiled library is not loaded (disabled by LUCID_ASSIGN_DISABLE_EXT=1)" in warned
    assert "Fix: unset LUCID_ASSIGN_DISABLE_EXT" in warned
    assert "RAN ultralytics.utils.tal" in out.stdout
    assert "REFUSED patch(backend='kernel'): the compiled library is not loaded" in out.stdout


def test_the_version_string_does_not_decide(integ, monkeypatch):
    """patch() goes by what the release computes, not by its version string."""
    import ultralytics

    monkeypatch.setattr(ultralytics, "__version__", "9.1.0")
    integ.patch()
    assert integ.is_patched() and all("patched (rule set 8.4.144)" in line for line in integ.patch_report()
                                      if not line.startswith("HungarianMatcher"))


def test_imports_nothing_until_called():
    code = ("import sys, lucid_assign.integrations.ultralytics as m; assert 'ultralytics' not in sys.modules; "
            "sys.modules['ultralytics'] = None\n"
            "try:\n    m.patch()\nexcept ImportError as e:\n    print('ImportError', e)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "pip install 'lucid-assign[ultralytics]'" in out.stdout


def test_a_seg_call_the_kernel_cannot_take_goes_to_the_peer(integ, peer_tal, library, monkeypatch):
    """A float16 mask_scale: not a kernel's dtype; the call runs the peer's own segmentation assigner, said once."""
    from cases import seg_problem as problem

    from ultralytics.utils import loss

    inputs = problem(30)
    inputs[7] = inputs[7].half()
    integ.patch()
    kw = dict(topk=10, num_classes=3, alpha=0.5, beta=6.0, stride=[8, 16, 32])
    ours = loss.SegTaskAlignedAssigner(**kw)
    masks = dict(zip(reference.SEG_INPUTS, inputs[6:]))
    ran = _count_calls(monkeypatch, peer_tal.SegTaskAlignedAssigner)
    with pytest.warns(integ.FallbackWarning, match=r"cannot run its kernel here \(.*mask_scale"):
        ours(*inputs[:6], **masks)
    assert ran == [1]
    with lower_index_topk("cpu"):
        got = ours(*inputs[:6], **masks)
        want = peer_tal.SegTaskAlignedAssigner(**kw)(*inputs[:6], **masks)
    assert ran == [1, 1, 1]
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_a_patched_seg_call_is_checked_once(integ, library, monkeypatch):
    """The patched segmentation assigner runs the kernel with no Python check of its tensors (the op checks them,
    once), whatever the object count, with the reference's outputs; a float64 mask_scale runs the kernel too, a
    backend forced by the environment the reference (checked by the Python layer); labels out of range and eps are
    refused on every call."""
    from cases import seg_problem as problem

    from ultralytics.utils import loss

    from lucid_assign import checks, dispatch

    integ.patch()
    ours = loss.SegTaskAlignedAssigner(topk=10, num_classes=3, alpha=0.5, beta=6.0, stride=[8, 16, 32])
    inputs = problem(33)
    masks = dict(zip(reference.SEG_INPUTS, inputs[6:]))
    checked = []
    for name in ("check_inputs", "check_seg_inputs"):
        real = getattr(checks, name)
        monkeypatch.setattr(checks, name, lambda *a, real=real, **k: checked.append(1) or real(*a, **k))
    kw = dict(topk=10, num_classes=3, alpha=0.5, beta=6.0, stride=[8, 16, 32])
    fewer = [t[:, :3] if i in (3, 4, 5) else t for i, t in enumerate(inputs)]
    for x in (inputs, fewer):
        got, want = ours(*x[:6], **masks), reference.assign_seg(*x, **kw)
        assert all(torch.equal(a, b) for a, b in zip(got[:2] + got[3:], want[:2] + want[3:]))
    ours(*inputs[:6], **dict(masks, mask_scale=masks["mask_scale"].double()))
    assert checked == []
    monkeypatch.setenv(dispatch.ENV_BACKEND, "reference")
    got = ours(*inputs[:6], **masks)
    assert checked == [1, 1]
    want = reference.assign_seg(*inputs, **kw)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    monkeypatch.delenv(dispatch.ENV_BACKEND)
    bad = list(inputs)
    bad[3] = inputs[3].clone()
    bad[3][inputs[5][..., 0] != 0] = 3  # every real object's label out of [0, 3)
    with pytest.raises(ValueError, match="gt_labels"):
        ours(*bad[:6], **masks)
    ours.eps = 0.0
    with pytest.raises(ValueError, match="eps must be a positive number"):
        ours(*inputs[:6], **masks)


def test_leaving_a_patched_block_restores_the_state_before_it(integ):
    from ultralytics.utils import loss

    integ.patch("kernel")
    with integ.patched("reference"):
        assert loss.TaskAlignedAssigner(num_classes=3).backend == "reference"
        with integ.patched("auto"):
            assert integ.effective_backend() == "auto"
        assert integ.effective_backend() == "reference"
    assert integ.is_patched() and integ.effective_backend() == "kernel"
    assert loss.TaskAlignedAssigner(num_classes=3).backend == "kernel"
    integ.unpatch()
    with integ.patched("kernel"):
        with integ.patched("reference"):
            pass
        assert integ.is_patched() and loss.TaskAlignedAssigner(num_classes=3).backend == "kernel"
    assert not integ.is_patched() and loss.TaskAlignedAssigner is not integ.LucidTaskAlignedAssigner


def _peer_log(integ, monkeypatch):
    """The lines the peer's logger emits (at its own level), with this process not yet announced."""
    import logging

    from ultralytics.utils import LOGGER

    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    LOGGER.addHandler(handler)
    monkeypatch.setattr(integ.STATE, "announced", False)
    return lines, lambda: LOGGER.removeHandler(handler)


@pytest.mark.parametrize("obb", [False, "seg"], ids=["detect", "seg"])
def test_the_patch_says_once_that_it_took_effect(integ, library, monkeypatch, obb):
    """One line per process through the peer's logger at the first patched call: lucid-assign's version, the backend
    that ran (LUCID_ASSIGN_BACKEND overriding patch()'s argument) and the device; none when the peer's logger is
    quieter than INFO."""
    import lucid_assign
    from ultralytics.utils import LOGGER

    lines, done = _peer_log(integ, monkeypatch)
    monkeypatch.setenv("LUCID_ASSIGN_BACKEND", "reference")
    try:
        _train(obb, integ.patched("kernel"), steps=2)
    finally:
        done()
    name = "SegTaskAlignedAssigner" if obb == "seg" else "TaskAlignedAssigner"
    assert [ln for ln in lines if "lucid-assign" in ln] == [
        f"lucid-assign {lucid_assign.__version__}: ultralytics' assigners are patched; the first call: {name} ran "
        "lucid-assign's reference on cpu"]
    lines, done = _peer_log(integ, monkeypatch)
    level = LOGGER.level
    LOGGER.setLevel(logging.WARNING)
    try:
        _train(obb, integ.patched(), steps=1)
    finally:
        LOGGER.setLevel(level)
        done()
    assert not [ln for ln in lines if "lucid-assign" in ln]


@pytest.mark.parametrize("backend", ["reference", "kernel"])
def test_a_class_count_set_at_run_time_is_followed(integ, library, backend):
    """YOLOE's visual-prompt loss sets ``num_classes`` on the assigner that the loss built, between calls, to the
    prompts' count. The patched assigner follows it as the peer's does: the reference bit for bit, the CPU kernel as
    the contract says."""
    from lucid_assign.synthetic import dota_like_batch
    from ultralytics.utils import loss

    peer = loss.TaskAlignedAssigner(topk=10, num_classes=80, alpha=0.5, beta=6.0)
    integ.patch(backend)
    ours = loss.TaskAlignedAssigner(topk=10, num_classes=80, alpha=0.5, beta=6.0)
    assert type(ours).__name__ == "LucidTaskAlignedAssigner"
    for nc in (80, 5, 17, 1):
        b = dota_like_batch(batch=2, img_size=128, num_classes=nc, objects=(3, 8), obb=False, seed=nc)
        inputs = [b[k] for k in reference.INPUTS]
        peer.num_classes = ours.num_classes = nc
        with lower_index_topk("cpu"):
            want = peer(*inputs)
        got = ours(*inputs)
        assert got[2].shape[-1] == nc
        assert_matches(got, want, exact=backend == "reference", case=f"{nc} classes")
