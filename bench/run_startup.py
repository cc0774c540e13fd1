"""What ``lucid-assign run`` adds to a command's start: ``lucid-assign run -- python -c pass`` against ``python -c
pass`` (the launcher's own interpreter start, then the command's with the import hook), and the hook alone (``python
-c pass`` with the environment run gives it), each the median of --reps runs, the variants alternating.

    python bench/run_startup.py              # 20 runs of each, three rounds
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import time


def _launch_module():
    """lucid_assign/_launch.py of the installed package, loaded alone (the package would import torch)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    found = importlib.util.find_spec("lucid_assign")
    folder = os.path.dirname(found.origin) if found and found.origin else os.path.join(here, "lucid_assign")
    spec = importlib.util.spec_from_file_location("lucid_assign_launch", os.path.join(folder, "_launch.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    launcher = os.path.join(os.path.dirname(sys.executable), "lucid-assign")
    if not os.path.exists(launcher):
        p.error(f"no console script {launcher}: install the package into this environment (pip install -e .)")
    python = [sys.executable, "-c", "pass"]
    launch = _launch_module()
    hooked = launch.environment("auto", list(launch.TRAINERS), [])
    variants = {"python -c pass": (python, None),
                "lucid-assign run -- python -c pass": ([launcher, "run", "--", *python], None),
                "python -c pass, the hook's environment": (python, hooked)}
    for _ in range(3):  # warm the file cache
        for cmd, env in variants.values():
            subprocess.run(cmd, env=env, check=True)
    print(f"{sys.executable} ({sys.version.split()[0]}), {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}; "
          f"medians of {args.reps} runs (ms)")
    for r in range(args.rounds):
        times = {k: [] for k in variants}
        for _ in range(args.reps):
            for name, (cmd, env) in variants.items():
                t = time.perf_counter()
                subprocess.run(cmd, env=env, check=True)
                times[name].append(time.perf_counter() - t)
        med = {k: 1e3 * statistics.median(v) for k, v in times.items()}
        base = med["python -c pass"]
        print(f"round {r + 1}: " + "; ".join(f"{k} {v:.1f}" + (f" (+{v - base:.1f})" if k != "python -c pass" else "")
                                             for k, v in med.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
