"""Runs a multi-process training script (tests/ddp_*.py) on the CPU and checks what its ranks said on stderr: with
LUCID_ASSIGN_VERBOSE=1 each rank's line of what its matcher ran, and each rank's count of matcher calls that equalled
the trainer's own (``lucid-assign-check rank R: N matcher calls, N the same as ...``)."""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_ranks(args: list, ran: str, own: str, ranks: int = 2) -> str:
    """Run ``python ARGS`` with the tree on the path; check that every rank said ``ran`` (a regular expression) and
    that all its matcher calls (at least one) equalled ``own``'s. Returns stderr."""
    env = dict(os.environ, LUCID_ASSIGN_VERBOSE="1", HF_HUB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    env.pop("MASTER_PORT", None)
    out = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    for rank in range(ranks):
        assert re.search(rf"lucid-assign \[rank {rank}, pid \d+\]: {ran}", out.stderr), out.stderr[-3000:]
        found = re.search(rf"lucid-assign-check rank {rank}: (\d+) matcher calls, (\d+) the same as {own}; patched "
                          rf"True; world size {ranks}", out.stderr)
        assert found and int(found.group(1)) == int(found.group(2)) > 0, out.stderr[-3000:]
    return out.stderr
