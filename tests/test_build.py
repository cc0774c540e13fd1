"""The build's choice of a CUDA compiler (build_tools/cuda_toolchain.py, which setup.py asks): a toolkit, else the
package index's compiler of torch's CUDA release (CUDA 13 on), else CPU kernels only with one line that says what to
install; each function of that module called directly. CI builds the suite's library with no toolkit in sight (.ci/run)
and sets LUCID_REQUIRE_PIP_NVCC=1, which makes the first test require CUDA kernels from that compiler."""

import os
import shutil
import sys
import types

import pytest
import torch

from lucid_assign import _library, dispatch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from build_tools import cuda_toolchain as toolchain  # noqa: E402


@pytest.mark.skipif(os.environ.get("LUCID_REQUIRE_PIP_NVCC") != "1",
                    reason="CI's build with no CUDA toolkit (LUCID_REQUIRE_PIP_NVCC=1)")
def test_a_build_with_no_toolkit_has_cuda_kernels_from_the_package_index():
    assert shutil.which("nvcc") is None and not os.path.exists("/usr/local/cuda"), "a toolkit is in sight"
    assert "CUDA_HOME" not in os.environ and "CUDA_PATH" not in os.environ
    info = _library.BUILD
    assert info and info["cuda"], info
    assert "of pip's nvidia-cuda-nvcc (no CUDA toolkit found)" in info["compiler"], info
    assert info["compiler"].startswith(f"nvcc {torch.version.cuda}."), (info, torch.version.cuda)
    ops = dispatch.backends()
    assert ops["cuda_ops"] == ops["cpu_ops"] and "assign" in ops["cuda_ops"], ops


def _torch(cuda, version, gpu=False):
    return types.SimpleNamespace(version=types.SimpleNamespace(cuda=cuda), __version__=version,
                                 cuda=types.SimpleNamespace(is_available=lambda: gpu))


def _find(cuda, version, why, root):
    return toolchain.find_compiler(_torch(cuda, version), True, why, str(root))


def _fake_nvcc(folder, release="12.8"):
    nvcc = folder / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.93'\n")
    nvcc.chmod(0o755)
    return nvcc


def test_a_cuda_12_torch_with_no_toolkit_gets_cpu_kernels_and_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvcc on it
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.delenv("FORCE_CUDA", raising=False)
    with_cuda, why, compiler = _find("12.8", "2.9.1+cu128", "a GPU is visible", tmp_path)
    assert (with_cuda, compiler) == (False, None)
    assert "no CUDA toolkit found, and the package index has no CUDA 12 compiler" in why
    assert "install the CUDA 12.8 toolkit, set CUDA_HOME" in why and "--no-build-isolation" in why
    monkeypatch.setenv("FORCE_CUDA", "1")
    with pytest.raises(SystemExit, match="FORCE_CUDA=1 but no CUDA toolkit found"):
        _find("12.8", "2.9.1+cu128", "FORCE_CUDA=1", tmp_path)


def test_a_toolkit_is_used_where_there_is_one(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    with_cuda, why, compiler = _find("13.0", "2.14.1+cu130", "FORCE_CUDA=1", tmp_path)
    assert with_cuda and why == "FORCE_CUDA=1" and compiler == f"nvcc None of the toolkit at {tmp_path}"


def test_an_nvcc_on_path_is_left_to_torch(monkeypatch, tmp_path):
    """A toolkit that is neither CUDA_HOME nor /usr/local/cuda (conda's, say): torch takes it from the nvcc on PATH."""
    nvcc = _fake_nvcc(tmp_path)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", str(nvcc.parent))
    with_cuda, _, compiler = _find("12.8", "2.9.1+cu128", "a GPU is visible", tmp_path)
    assert with_cuda and compiler == f"nvcc 12.8 on PATH ({nvcc})" and "CUDA_HOME" not in os.environ


def test_the_compiler_is_torchs_cuda_release():
    """Every package of the compiler is pinned to torch's CUDA release (where torch's `cuda-toolkit` is installed, to
    the versions it pins)."""
    for release in ("13.0", "13.2"):
        wanted = toolchain.compiler_requirements(release)
        assert [w.split("==")[0] for w in wanted] == list(toolchain.PIP_COMPILER)
        assert all(w.split("==")[1].startswith(release + ".") for w in wanted), wanted


def test_force_cuda_and_what_torch_has_decide_whether_to_compile(monkeypatch):
    monkeypatch.setenv("FORCE_CUDA", "0")
    assert toolchain.want_cuda(_torch("13.0", "2.14.1+cu130", gpu=True)) == (False, "FORCE_CUDA=0")
    monkeypatch.setenv("FORCE_CUDA", "1")
    assert toolchain.want_cuda(_torch("13.0", "2.14.1+cu130")) == (True, "FORCE_CUDA=1")
    with pytest.raises(SystemExit, match="FORCE_CUDA=1 but this torch has no CUDA support"):
        toolchain.want_cuda(_torch(None, "2.14.1+cpu"))
    monkeypatch.delenv("FORCE_CUDA")
    assert toolchain.want_cuda(_torch("13.0", "2.14.1+cu130", gpu=True)) == (True, "a GPU is visible")
    assert toolchain.want_cuda(_torch("13.0", "2.14.1+cu130"))[0] is False
    assert toolchain.want_cuda(_torch(None, "2.14.1+cpu")) == (False, "torch 2.14.1+cpu has no CUDA support")
    monkeypatch.setenv("FORCE_CUDA", "0")
    assert toolchain.find(_torch("13.0", "2.14.1+cu130", gpu=True), ROOT) == (False, "FORCE_CUDA=0", None)


def test_a_toolkit_behind_an_nvcc_on_path_becomes_cuda_home(monkeypatch, tmp_path):
    """torch would take the parent of the folder holding nvcc, which a wrapper in /usr/local/bin makes /usr/local:
    a real toolkit (nvcc and cuda_runtime.h) is set as CUDA_HOME first, and nothing is set where there is none."""
    for name in ("CUDA_HOME", "CUDA_PATH"):  # recorded, so that what default_cuda_home() sets is undone after
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setattr(toolchain, "STANDARD_HOME", str(tmp_path / "none"))
    kit = tmp_path / "kit"
    nvcc = _fake_nvcc(kit)
    wrapper = tmp_path / "wrapper"
    wrapper.mkdir()
    (wrapper / "nvcc").symlink_to(nvcc)
    monkeypatch.setenv("PATH", str(wrapper))
    toolchain.default_cuda_home()
    assert "CUDA_HOME" not in os.environ  # no headers: not a toolkit
    (kit / "include").mkdir()
    (kit / "include" / "cuda_runtime.h").write_text("")
    toolchain.default_cuda_home()
    assert os.environ["CUDA_HOME"] == str(kit)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "mine"))
    toolchain.default_cuda_home()
    assert os.environ["CUDA_HOME"] == str(tmp_path / "mine")  # the user's own is kept


def test_nvcc_release(tmp_path):
    assert toolchain.nvcc_release(str(_fake_nvcc(tmp_path, "13.2"))) == "13.2"
    assert toolchain.nvcc_release(str(tmp_path / "missing")) is None


def test_a_toolkit_with_the_math_headers_needs_no_shim(tmp_path):
    (tmp_path / "include").mkdir()
    (tmp_path / "include" / "cusparse.h").write_text("")
    assert toolchain.missing_headers_dir(str(tmp_path), str(tmp_path)) is None
