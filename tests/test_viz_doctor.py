"""`lucid-assign viz` (PNG of the requested size for both box kinds and for label files) and `lucid-assign doctor`
(passes here, fails when a backend is made to disagree)."""

import math
import os
import subprocess
import sys

import pytest
import torch

from lucid_assign import __main__ as cli
from lucid_assign import ops, viz


def _png_size(path):
    import matplotlib.image

    h, w = matplotlib.image.imread(str(path)).shape[:2]
    return w, h


@pytest.fixture(autouse=True)
def _matplotlib():
    pytest.importorskip("matplotlib")


@pytest.mark.parametrize("kind", [[], ["--hbb"]], ids=["obb", "hbb"])
def test_viz_synthetic_png_of_requested_size(tmp_path, kind, capsys):
    out = tmp_path / "v.png"
    cli.main(["viz", *kind, "--img-size", "256", "--objects", "5", "15", "--size", "900", "500", "--out", str(out)])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert _png_size(out) == (900, 500)
    assert "positives" in capsys.readouterr().out


def test_viz_compare_draws_the_floor_effect(tmp_path):
    out = tmp_path / "c.png"
    cli.main(["viz", "--img-size", "256", "--objects", "10", "20", "--compare", "floor=0", "--size", "1000", "420",
              "--out", str(out)])
    assert _png_size(out) == (1000, 420)


def test_viz_floor_changes_positives():
    batch = viz.dota_like_batch(batch=1, img_size=256, num_classes=15, objects=(20, 20), seed=3)
    base = dict(topk=10, topk2=None, alpha=0.5, beta=6.0, floor=None)
    with_floor = viz.summarise(viz.assign_with(batch, base, 15), batch, 0, 256)
    without = viz.summarise(viz.assign_with(batch, viz.parse_settings("floor=0", base), 15), batch, 0, 256)
    assert without["none"] > with_floor["none"]


def test_viz_unknown_setting():
    with pytest.raises(ValueError, match="unknown setting"):
        viz.parse_settings("speed=9", dict(topk=10))


def test_viz_label_files(tmp_path):
    hbb = tmp_path / "hbb.txt"
    hbb.write_text("0 0.5 0.5 0.2 0.1\n3 0.1 0.2 0.02 0.03\n")
    obb = tmp_path / "obb.txt"
    # a 0.2 x 0.1 rectangle at (0.5, 0.5) rotated by 30 degrees, corners in order
    c, s = math.cos(math.pi / 6), math.sin(math.pi / 6)
    pts = [(0.5 + dx * c - dy * s, 0.5 + dx * s + dy * c) for dx, dy in ((-0.1, -0.05), (0.1, -0.05), (0.1, 0.05),
                                                                          (-0.1, 0.05))]
    obb.write_text("1 " + " ".join(f"{v:.6f}" for p in pts for v in p) + "\n")
    for path in (hbb, obb):
        out = tmp_path / (path.stem + ".png")
        cli.main(["viz", "--labels", str(path), "--img-size", "640", "--size", "640", "640", "--out", str(out)])
        assert _png_size(out) == (640, 640)
    boxes, labels, rotated = viz.read_labels(str(obb), 1000)
    assert rotated and labels.tolist() == [1]
    torch.testing.assert_close(boxes[0], torch.tensor([500.0, 500.0, 200.0, 100.0, math.pi / 6], dtype=torch.float64),
                               atol=1e-3, rtol=0)
    boxes, labels, rotated = viz.read_labels(str(hbb), 100)
    assert not rotated and boxes[0, :4].tolist() == pytest.approx([50.0, 50.0, 20.0, 10.0])


def test_viz_rejects_bad_label_lines(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("0 0.5 0.5 0.2\n")
    with pytest.raises(ValueError, match="bad.txt:1"):
        viz.read_labels(str(bad), 640)


def test_doctor_passes(library, capsys):
    assert cli.main(["doctor"]) == 0
    text = capsys.readouterr().out
    assert "PASS cpu" in text and "compiled library: loaded" in text and "backend='auto'" in text
    assert text.rstrip().endswith("all checks passed")


def test_doctor_shows_the_peer_and_its_patch_check(library, peer_tal, capsys):
    import ultralytics

    assert cli.main(["doctor"]) == 0
    text = capsys.readouterr().out
    assert f"ultralytics (the peer trainer): {ultralytics.__version__}" in text
    assert f"PASS ultralytics {ultralytics.__version__}: TaskAlignedAssigner: rule set 8.4.144;" in text


def test_doctor_fails_when_the_patch_check_fails(library, peer_tal, monkeypatch, capsys):
    from lucid_assign.integrations import ultralytics as integ

    monkeypatch.setattr(integ, "check_peer", lambda tal=None: {"TaskAlignedAssigner": (None, "fg_mask differs")})
    assert cli.main(["doctor"]) == 1
    text = capsys.readouterr().out
    assert "FAIL ultralytics" in text and "patch() refuses it" in text and "1 check(s) FAILED" in text


def test_doctor_that_checked_no_kernel_fails():
    """With the library not loaded (LUCID_ASSIGN_DISABLE_EXT=1) no kernel can be checked: doctor says so, exit 1."""
    env = dict(os.environ, LUCID_ASSIGN_DISABLE_EXT="1")
    run = subprocess.run([sys.executable, "-m", "lucid_assign", "doctor"], capture_output=True, text=True, env=env,
                         timeout=300)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "SKIP" in run.stdout and "all checks passed" not in run.stdout
    assert "no kernel was checked (disabled by LUCID_ASSIGN_DISABLE_EXT=1)" in run.stdout


def test_doctor_fails_when_a_backend_disagrees(library, monkeypatch, capsys):
    real = ops.assign

    def perturbed(*args, **kwargs):
        out = list(real(*args, **kwargs))
        out[3] = out[3].clone()
        out[3].view(-1)[0] = ~out[3].view(-1)[0]  # one anchor's foreground flag flipped
        return tuple(out)

    monkeypatch.setattr(ops, "assign", perturbed)
    assert cli.main(["doctor"]) == 1
    assert "FAIL cpu" in capsys.readouterr().out
