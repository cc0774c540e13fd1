"""What ``lucid-assign run`` adds to a command's start: ``lucid-assign run -- python -c pass`` against ``python -c
pass`` (this environment's Python running code: it runs in the launcher's process, with the import hook added there),
``lucid-assign run -- python -B -c pass`` against ``python -B -c pass`` (an interpreter option: the command replaces
the launcher, so two interpreters start), and the hook alone (``python -c pass`` with the environment run gives it),
each the median of --reps runs, the variants alternating.

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
    option = [sys.executable, "-B", "-c", "pass"]
    variants = {"python -c pass": (python, None),
                "lucid-assign run -- python -c pass": ([launcher, "run", "--", *python], None),
                "python -c pass, the hook's environment": (python, hooked),
                "python -B -c pass": (option, None),
                "lucid-assign run -- python -B -c pass": ([launcher, "run", "--", *option], None)}
    bases = {"lucid-assign run -- python -c pass": "python -c pass",
             "python -c pass, the hook's environment": "python -c pass",
             "lucid-assign run -- python -B -c pass": "python -B -c pass"}
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
        print(f"round {r + 1}: " + "; ".join(f"{k} {v:.1f}" + (f" ({v - med[bases[k]]:+.1f})" if k in bases else "")
                                             for k, v in med.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
