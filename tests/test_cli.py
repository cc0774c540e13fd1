"""The command line as a new user meets it: each mistake said in one line that names the argument, with exit status 2
(no traceback), the versions at hand, and timings of warm calls only."""

import json
import os
import subprocess
import sys

import pytest
import torch

import lucid_assign
from lucid_assign import __main__ as cli
from lucid_assign import bench


def _usage_error(argv, capsys):
    """Run the command line; return its error line (it must exit 2 without a traceback)."""
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize("command", ["bench", "demo"])
def test_an_unknown_device_is_a_usage_error(command, capsys):
    line = _usage_error([command, "--device", "gpu"], capsys)
    assert line.startswith(f"lucid-assign {command}: error: argument --device: invalid device 'gpu'")
    assert "choose cpu, cuda" in line


@pytest.mark.parametrize("command", ["bench", "demo"])
@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_cuda_without_a_gpu_is_a_usage_error(command, device, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    line = _usage_error([command, "--device", device], capsys)
    assert line.startswith(f"lucid-assign {command}: error: argument --device: {device}: torch sees no CUDA GPU")
    assert line.endswith("use --device cpu")


def test_cuda_without_a_gpu_from_a_shell():
    """The same from a fresh process where torch sees no GPU (CUDA_VISIBLE_DEVICES empty): one error line, exit 2."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    run = subprocess.run([sys.executable, "-m", "lucid_assign", "bench", "--device", "cuda"], capture_output=True,
                         text=True, env=env, timeout=300)
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr
    assert "argument --device: cuda: torch sees no CUDA GPU" in run.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("argv, expected", [
    (["bench", "--backends", "reference,fast"], "argument --backends: 'reference,fast': unknown ['fast']"),
    (["bench", "--reps", "0"], "argument --reps: '0': expected a whole number >= 1"),
    (["bench", "--objects", "-3"], "argument --objects: '-3': expected a whole number >= 0"),
    (["viz", "--labels", "/nonexistent/labels.txt"], "argument --labels: cannot read '/nonexistent/labels.txt': no "
     "such file"),
    (["viz", "--compare", "floor=abc"], "argument --compare: floor takes a number, got 'abc'"),
    (["viz", "--compare", "topk=1.5"], "argument --compare: topk takes a whole number, got '1.5'"),
    (["viz", "--compare", "bogus=1"], "argument --compare: unknown setting 'bogus'; choose from topk, topk2, alpha"),
    (["viz", "--compare", "floor"], "argument --compare: 'floor' needs a value"),
])
def test_mistakes_name_the_argument(argv, expected, capsys):
    line = _usage_error(argv, capsys)
    assert line.startswith(f"lucid-assign {argv[0]}: error: {expected}"), line


def test_a_bad_label_file_names_the_argument(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    bad = tmp_path / "bad.txt"
    bad.write_text("0 0.5 0.5 0.2\n")
    line = _usage_error(["viz", "--labels", str(bad), "--out", str(tmp_path / "x.png")], capsys)
    assert line.startswith("lucid-assign viz: error: argument --labels: ") and "bad.txt:1: expected" in line
    unknown_class = tmp_path / "classes.txt"
    unknown_class.write_text("20 0.5 0.5 0.2 0.1\n")
    line = _usage_error(["viz", "--labels", str(unknown_class), "--out", str(tmp_path / "x.png")], capsys)
    assert "argument --labels: label 20 in the file is outside --classes 15" in line


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    out = capsys.readouterr().out.strip()
    assert exc.value.code == 0
    assert out.startswith(f"lucid-assign {lucid_assign.__version__}") and f"torch {torch.__version__}" in out
    assert "compiled library" in out and "ultralytics" in out


def test_the_bench_json_records_the_versions(tmp_path, capsys):
    out = tmp_path / "b.json"
    assert cli.main(["bench", "--kind", "hbb", "--objects", "3", "--batch", "1", "--reps", "1", "--device", "cpu",
                     "--backends", "reference", "--no-progress", "--out", str(out)]) == 0
    env = json.loads(out.read_text())["environment"]
    assert env["lucid_assign"].startswith(lucid_assign.__version__)
    try:
        from importlib.metadata import version

        peer = version("ultralytics")
    except Exception:  # not installed
        peer = None
    assert env["ultralytics"] == peer


def test_timing_starts_after_the_first_calls_are_warm(monkeypatch):
    """time_calls warms every input copy up, and goes on while calls are still getting faster, before it times
    anything: with first calls of falling cost (a fake clock: 100, 60, 30, 12, 5, 2 units, then 1), even reps=1 times
    a warm call; and one slow call among warm ones is not taken for a warm one."""
    clock = [0.0]
    calls = []
    costs = [100.0, 60.0, 30.0, 12.0, 5.0, 2.0]
    monkeypatch.setattr(bench.time, "perf_counter", lambda: clock[0])

    def call(copy):
        calls.append(copy)
        clock[0] += costs[len(calls) - 1] if len(calls) <= len(costs) else 1.0

    fns = [lambda i=i: call(i) for i in range(3)]
    assert bench.time_calls(fns, "cpu", reps=1) == [1.0]
    assert set(calls[:3]) == {0, 1, 2}, "every copy is warmed up"
    assert bench.time_calls(fns, "cpu", reps=4) == [1.0] * 4
    calls.clear()
    costs[:] = [1.0, 1.0, 50.0]  # the last warm-up call slow: warm-up goes on
    assert bench.time_calls(fns, "cpu", reps=2) == [1.0, 1.0] and len(calls) == 7
