"""CMakeLists.txt builds csrc/ into a LibTorch library that torch.ops.load_library loads and runs.

The check runs in a subprocess with the Python extension disabled: a process may register the `lucid` namespace only
once, and here the CMake library must be the one that does it.
"""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.utils

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHECK = textwrap.dedent(
    """
    import sys, torch
    torch.ops.load_library(sys.argv[1])
    sys.path.insert(0, sys.argv[2])
    from lucid_assign import reference, _library
    assert not _library.loaded()  # the ops below come from the CMake library
    from cases import make_problem
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() and sys.argv[3] == "ON" else [])
    for device in devices:
        for obb in (False, True):
            _, _, anc, _, gt, mask = (t.to(device) for t in make_problem(0, obb))
            got = torch.ops.lucid.points_in_boxes(anc, gt, mask, 16.0)
            assert torch.equal(got, reference.points_in_boxes(anc, gt, mask, 16)), (device, obb)
    print("cmake library OK on", devices)
    """
)


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake not installed")
def test_cmake_library_loads_and_runs(tmp_path):
    with_cuda = "ON" if torch.cuda.is_available() else "OFF"
    env = dict(os.environ)
    if torch.cuda.is_available() and "TORCH_CUDA_ARCH_LIST" not in env:
        env["TORCH_CUDA_ARCH_LIST"] = "%d.%d" % torch.cuda.get_device_capability()
    build = tmp_path / "build"
    subprocess.run(
        ["cmake", "-S", ROOT, "-B", str(build), f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
         f"-DLUCID_WITH_CUDA={with_cuda}", "-DCMAKE_BUILD_TYPE=Release"],
        check=True, env=env, capture_output=True, text=True,
    )
    jobs = env.get("MAX_JOBS", str(os.cpu_count() or 2))
    subprocess.run(["cmake", "--build", str(build), "-j", jobs], check=True, env=env, capture_output=True, text=True)
    lib = build / "liblucid_assign.so"
    assert lib.exists()
    env.update(LUCID_ASSIGN_DISABLE_EXT="1", PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""))
    out = subprocess.run(
        [sys.executable, "-c", CHECK, str(lib), os.path.join(ROOT, "tests"), with_cuda],
        env=env, capture_output=True, text=True,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "cmake library OK" in out.stdout


def test_package_works_without_the_library():
    """With the compiled library absent, the package imports and the reference assigns."""
    code = (
        "import lucid_assign, sys; sys.path.insert(0, 'tests'); from cases import make_problem;"
        "assert not lucid_assign.backends()['library'];"
        "out = lucid_assign.assign(*make_problem(0, True), num_classes=7, topk=10); print(int(out[3].sum()))"
    )
    env = dict(os.environ, LUCID_ASSIGN_DISABLE_EXT="1")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert int(out.stdout.strip()) > 0
