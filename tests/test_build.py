"""setup.py's choice of a CUDA compiler: a toolkit, else the package index's compiler of torch's CUDA release (CUDA
13 on), else CPU kernels only with one line that says what to install. CI builds the suite's library with no toolkit in
sight (.ci/run) and sets LUCID_REQUIRE_PIP_NVCC=1, which makes the first test require CUDA kernels from that compiler."""

import os
import shutil
import types

import pytest
import torch

from lucid_assign import _library, dispatch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _setup_module():
    """setup.py's functions, without running its setup()."""
    with open(os.path.join(ROOT, "setup.py")) as f:
        source = f.read()
    assert source.rstrip().endswith("main()")
    namespace = {"__file__": os.path.join(ROOT, "setup.py"), "__name__": "lucid_setup"}
    exec(compile(source.rstrip()[: -len("main()")], "setup.py", "exec"), namespace)
    return types.SimpleNamespace(**namespace)


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


def _torch(cuda, version):
    return types.SimpleNamespace(version=types.SimpleNamespace(cuda=cuda), __version__=version)


def test_a_cuda_12_torch_with_no_toolkit_gets_cpu_kernels_and_what_to_install(monkeypatch, tmp_path):
    setup = _setup_module()
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvcc on it
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.delenv("FORCE_CUDA", raising=False)
    with_cuda, why, compiler = setup._find_compiler(_torch("12.8", "2.9.1+cu128"), True, "a GPU is visible")
    assert (with_cuda, compiler) == (False, None)
    assert "no CUDA toolkit found, and the package index has no CUDA 12 compiler" in why
    assert "install the CUDA 12.8 toolkit, set CUDA_HOME" in why and "--no-build-isolation" in why
    monkeypatch.setenv("FORCE_CUDA", "1")
    with pytest.raises(SystemExit, match="FORCE_CUDA=1 but no CUDA toolkit found"):
        setup._find_compiler(_torch("12.8", "2.9.1+cu128"), True, "FORCE_CUDA=1")


def test_a_toolkit_is_used_where_there_is_one(monkeypatch, tmp_path):
    setup = _setup_module()
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    with_cuda, why, compiler = setup._find_compiler(_torch("13.0", "2.14.1+cu130"), True, "FORCE_CUDA=1")
    assert with_cuda and why == "FORCE_CUDA=1" and compiler == f"nvcc None of the toolkit at {tmp_path}"


def test_an_nvcc_on_path_is_left_to_torch(monkeypatch, tmp_path):
    """A toolkit that is neither CUDA_HOME nor /usr/local/cuda (conda's, say): torch takes it from the nvcc on PATH."""
    setup = _setup_module()
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.8, V12.8.93'\n")
    nvcc.chmod(0o755)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", str(nvcc.parent))
    with_cuda, _, compiler = setup._find_compiler(_torch("12.8", "2.9.1+cu128"), True, "a GPU is visible")
    assert with_cuda and compiler == f"nvcc 12.8 on PATH ({nvcc})" and "CUDA_HOME" not in os.environ


def test_the_compiler_is_torchs_cuda_release():
    """Every package of the compiler is pinned to torch's CUDA release (where torch's `cuda-toolkit` is installed, to
    the versions it pins)."""
    setup = _setup_module()
    for release in ("13.0", "13.2"):
        wanted = setup._compiler_requirements(release)
        assert [w.split("==")[0] for w in wanted] == list(setup.PIP_COMPILER)
        assert all(w.split("==")[1].startswith(release + ".") for w in wanted), wanted
