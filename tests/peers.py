"""The peer's releases for the tests: each installed without its dependencies into a folder of its own (pip install
--no-deps --target), once per folder. LUCID_PEER_RELEASES keeps the folder between runs (default: a temporary one)."""

import os
import subprocess
import sys

import pytest


def install_releases(tmp_path_factory, versions, extra=None) -> dict:
    """{version: its folder}; ``extra[version]``: modules that release imports and the current peer no longer needs,
    installed beside it. Skips without pip's registry, or fails with LUCID_REQUIRE_PEER=1."""
    folder = os.environ.get("LUCID_PEER_RELEASES") or str(tmp_path_factory.mktemp("peer-releases"))
    paths = {}
    for version in versions:
        target = os.path.join(folder, version)
        if not os.path.isdir(os.path.join(target, "ultralytics")):
            done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
                                   "--target", target, f"ultralytics=={version}", *(extra or {}).get(version, [])],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                msg = f"cannot install ultralytics=={version}: {done.stderr[-500:]}"
                if os.environ.get("LUCID_REQUIRE_PEER") == "1":
                    pytest.fail(msg)
                pytest.skip(msg)
        paths[version] = target
    return paths
