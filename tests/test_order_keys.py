"""The order keys by which the CUDA passes rank (csrc/rules.h: order_key, row_key) against rules::ranks_before, the
order of the CPU passes: tests/cpp/order_keys.cpp, built with the host C++ compiler and run on every class of float
(NaNs of any sign and payload, infinities, -0 and +0, denormals, ties, a spread of 2^32 / 2^24 bit patterns) and, for
the keys' round trip, on every float. The device reads the same functions, with CUDA's bit casts for memcpy."""

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _compiler() -> list:
    cxx = shlex.split(os.environ.get("CXX", "c++"))
    if not cxx or shutil.which(cxx[0]) is None:
        msg = f"no host C++ compiler ({os.environ.get('CXX', 'c++')!r})"
        if os.environ.get("LUCID_REQUIRE_EXT") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    return cxx


def test_order_keys_encode_ranks_before(tmp_path):
    exe = tmp_path / "order_keys"
    build = _compiler() + ["-std=c++17", "-O2", "-ffp-contract=off", f"-I{ROOT / 'csrc'}",
                           str(ROOT / "tests" / "cpp" / "order_keys.cpp"), "-o", str(exe)]
    subprocess.run(build, check=True, capture_output=True, text=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 failures" in run.stdout
