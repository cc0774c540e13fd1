"""Real training runs of the peer trainer (ultralytics) with the patch, on the CPU: ``YOLO(...).train()``, the command
line (``lucid-assign yolo ...``), and a rank started the way the peer starts the ranks of a multi-GPU run. Each
trains one epoch on a tiny synthetic dataset written to a temporary folder (plots off, nothing downloaded).

Evidence that lucid-assign ran: in-process, the trainer's loss holds lucid-assign's assigners; in other processes,
what ``LUCID_ASSIGN_VERBOSE=1`` prints from there (each patched assigner's first call, and its backend)."""

import os
import subprocess
import sys

import pytest

from lucid_assign.synthetic import write_yolo_dataset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = dict(epochs=1, imgsz=64, batch=2, workers=0, plots=False, device="cpu", amp=False, exist_ok=True,
             verbose=False)
KERNEL_CALLS = ("LucidRotatedTaskAlignedAssigner(topk=10, topk2=10) ran lucid-assign's kernel on cpu",
                "LucidRotatedTaskAlignedAssigner(topk=7, topk2=1) ran lucid-assign's kernel on cpu")


@pytest.fixture
def integ(peer_tal, library):
    from lucid_assign.integrations import ultralytics as integ

    yield integ
    integ.unpatch()


def _assigners(criterion):
    parts = [criterion.one2many, criterion.one2one] if hasattr(criterion, "one2one") else [criterion]
    return [p.assigner for p in parts]


@pytest.mark.parametrize("obb", [False, True], ids=["detect", "obb"])
def test_yolo_train_uses_lucid_assign(integ, tmp_path, obb):
    from ultralytics import YOLO

    data = write_yolo_dataset(tmp_path / "data", images=4, obb=obb)
    integ.patch()
    model = YOLO("yolo26n-obb.yaml" if obb else "yolo26n.yaml")
    model.train(data=data, project=str(tmp_path / "runs"), name="run", **TRAIN)
    kinds = {type(a).__name__ for a in _assigners(model.trainer.model.criterion)}
    assert kinds == {"LucidRotatedTaskAlignedAssigner" if obb else "LucidTaskAlignedAssigner"}
    assert all(a.backend == "auto" for a in _assigners(model.trainer.model.criterion))
    assert (tmp_path / "runs" / "run" / "weights" / "last.pt").exists()


def test_cli_train_uses_lucid_assign(library, peer_tal, tmp_path):
    data = write_yolo_dataset(tmp_path / "data", images=4, obb=True)
    args = [f"data={data}", "model=yolo26n-obb.yaml", f"project={tmp_path / 'runs'}", "name=cli"]
    args += [f"{k}={v}" for k, v in TRAIN.items()]
    env = dict(os.environ, LUCID_ASSIGN_VERBOSE="1",
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-m", "lucid_assign", "yolo", "obb", "train", *args], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "patched ultralytics" in out.stderr
    for line in KERNEL_CALLS:
        assert line in out.stderr, out.stderr[-3000:]
    assert (tmp_path / "runs" / "cli" / "weights" / "last.pt").exists()


def test_the_peer_multi_gpu_script_patches_its_rank(integ, tmp_path):
    """What the peer's launch runs: its DDP script, with lucid-assign's preamble and the chosen backend."""
    from ultralytics.models.yolo.obb import OBBTrainer
    from ultralytics.utils.dist import ddp_cleanup, generate_ddp_command

    data = write_yolo_dataset(tmp_path / "data", images=2, obb=True)
    integ.patch("kernel")
    trainer = OBBTrainer(overrides=dict(model="yolo26n-obb.yaml", data=data, project=str(tmp_path / "runs"),
                                        name="ddp", **TRAIN))
    trainer.world_size = 2  # as for device=0,1
    cmd, file = generate_ddp_command(trainer)
    try:
        assert cmd[1:4] == ["-m", "torch.distributed.run", "--nproc_per_node"] and cmd[4] == "2"
        script = open(file).read()
        assert "_lucid_ultralytics.patch('kernel')" in script.split("if __name__")[0]
        compile(script, file, "exec")
    finally:
        ddp_cleanup(trainer, file)
    integ.unpatch()
    trainer = OBBTrainer(overrides=dict(model="yolo26n-obb.yaml", data=data, project=str(tmp_path / "runs"),
                                        name="ddp2", **TRAIN))
    trainer.world_size = 2
    cmd, file = generate_ddp_command(trainer)
    try:
        assert "lucid" not in open(file).read()  # unpatched, the peer's script is its own again
    finally:
        ddp_cleanup(trainer, file)


def test_a_rank_launched_as_the_peer_launches_it_is_patched(integ, tmp_path, monkeypatch, capfd):
    """YOLO(...).train() through the peer's multi-GPU launch (torch.distributed.run on the script it writes), with two
    ranks that train on the CPU (tests/launched_trainer.py): each rank patches itself, with the backend chosen here,
    and its losses run lucid-assign's kernel."""
    from ultralytics import YOLO

    from launched_trainer import LaunchedOBBTrainer

    data = write_yolo_dataset(tmp_path / "data", images=4, obb=True)
    monkeypatch.setenv("LUCID_ASSIGN_VERBOSE", "1")
    integ.patch("kernel")
    model = YOLO("yolo26n-obb.yaml")
    model.train(trainer=LaunchedOBBTrainer, data=data, project=str(tmp_path / "runs"), name="rank", **TRAIN)
    err = capfd.readouterr().err
    for rank in range(2):
        lines = [ln for ln in err.splitlines() if f"lucid-assign [rank {rank}, pid" in ln]
        assert any("patched ultralytics" in ln and "(backend 'kernel')" in ln for ln in lines), err[-3000:]
        for call in KERNEL_CALLS:
            assert any(call in ln for ln in lines), err[-3000:]
    assert (tmp_path / "runs" / "rank" / "weights" / "last.pt").exists()


def test_every_rank_of_the_peer_rtdetr_launch_is_patched(integ, tmp_path, monkeypatch, capfd):
    """RTDETR(...).train() through the peer's multi-GPU launch (two ranks on the CPU, tests/launched_trainer.py): each
    rank patches itself with the backend chosen here, its RT-DETR matcher runs lucid-assign's kernel, and every
    matcher call of every rank equals the peer's own on the same inputs."""
    import re

    from ultralytics import RTDETR

    from launched_trainer import LaunchedRTDETRTrainer

    data = write_yolo_dataset(tmp_path / "data", images=4, obb=False)
    monkeypatch.setenv("LUCID_ASSIGN_VERBOSE", "1")
    monkeypatch.setenv("LUCID_TEST_CHECK_MATCHER", "1")
    integ.patch("kernel")
    model = RTDETR("rtdetr-l.yaml")
    model.train(trainer=LaunchedRTDETRTrainer, data=data, project=str(tmp_path / "runs"), name="rtdetr", **TRAIN)
    err = capfd.readouterr().err
    for rank in range(2):
        lines = [ln for ln in err.splitlines() if f"lucid-assign [rank {rank}, pid" in ln]
        assert any("patched ultralytics" in ln and "(backend 'kernel')" in ln for ln in lines), err[-3000:]
        assert any("HungarianMatcher ran lucid-assign's kernel on cpu" in ln for ln in lines), err[-3000:]
        found = re.search(rf"lucid-assign-check rank {rank}: (\d+) matcher calls, (\d+) the same as the peer's own",
                          err)
        assert found and int(found.group(1)) == int(found.group(2)) > 0, err[-3000:]
    assert (tmp_path / "runs" / "rtdetr" / "weights" / "last.pt").exists()


def test_a_plain_cli_log_says_that_the_patch_took_effect(library, peer_tal, tmp_path):
    """Without LUCID_ASSIGN_VERBOSE the peer's own log (its logger) holds one line, once, that names lucid-assign's
    version and the backend that ran, which LUCID_ASSIGN_BACKEND overrides."""
    import lucid_assign

    data = write_yolo_dataset(tmp_path / "data", images=2, obb=False)
    args = [f"data={data}", "model=yolo26n.yaml", f"project={tmp_path / 'runs'}", "name=plain"]
    args += [f"{k}={v}" for k, v in TRAIN.items()]
    env = dict(os.environ, LUCID_ASSIGN_BACKEND="reference",
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    env.pop("LUCID_ASSIGN_VERBOSE", None)
    out = subprocess.run([sys.executable, "-m", "lucid_assign", "yolo", "--backend", "kernel", "detect", "train",
                          *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    said = [ln for ln in (out.stdout + out.stderr).splitlines() if "lucid-assign" in ln]
    assert said == [f"lucid-assign {lucid_assign.__version__}: ultralytics' assigners are patched; the first call: "
                    "TaskAlignedAssigner ran lucid-assign's reference on cpu"], said
