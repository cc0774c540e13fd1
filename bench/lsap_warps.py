"""The CUDA linear sum assignment's register solvers against each other: the default (``lsap_registers``) and
``lsap_warps`` at each warp count (``LUCID_LSAP_WARPS`` = 1, 2, 4, 8; float32 problems of up to 320 / 512 / 640 /
1,024 columns), each in a process of its own (the switch is read once a process), the default first and last so that
a drift of the machine shows; one record, one table.

    python bench/lsap_warps.py --out lsap-warps.json
    python bench/lsap_warps.py --shapes 16x300x200 --costs untrained --warps 1 4 --reps 5

Each run is ``python -m lucid_assign bench --kind lsap --backends kernel`` (the op alone, CUDA events; the medians of
``--reps`` calls). The table gives each run's median in ms and the default's time over it (above 1: faster than the
default). A shape whose columns a warp count cannot hold runs the default there (the same time).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

SHAPES = ["16x300x10", "16x300x50", "16x300x200", "208x300x10", "208x300x50", "208x300x100", "208x300x200",
          "208x300x300", "208x300x600"]  # RT-DETR's (16 images) and RF-DETR Small's (208 problems) at 10-600 objects


def run(warps: str, args) -> dict:
    """One process of the LSAP benchmark with LUCID_LSAP_WARPS=warps ("default": unset); its record."""
    env = {k: v for k, v in os.environ.items() if k != "LUCID_LSAP_WARPS"}
    if warps != "default":
        env["LUCID_LSAP_WARPS"] = warps
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "record.json")
        command = [sys.executable, "-m", "lucid_assign", "bench", "--kind", "lsap", "--shapes", *args.shapes,
                   "--costs", *args.costs, "--device", args.device, "--backends", "kernel", "--reps", str(args.reps),
                   "--no-progress", "--out", out]
        done = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            raise SystemExit(f"LUCID_LSAP_WARPS={warps}: the benchmark failed:\n{done.stderr[-2000:]}")
        with open(out) as f:
            return json.load(f)


def table(runs: list) -> list:
    """One line per shape and kind of costs: each run's median (ms) and the default's (the first run's) over it."""
    medians = [{(r["shape"], r["costs"]): r.get("median_s") for r in record["results"]} for _, record in runs]
    head = f"{'shape':>12} {'costs':9}" + "".join(f" {('W=' + w if w != 'default' else w):>16}" for w, _ in runs)
    lines = [head]
    for key in medians[0]:
        base = medians[0][key]
        cells = []
        for m in medians:
            t = m.get(key)
            cells.append(f" {'-':>16}" if t is None or base is None else f" {t * 1e3:9.4f} {base / t:5.2f}x")
        lines.append(f"{key[0]:>12} {key[1]:9}" + "".join(cells))
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", nargs="+", default=SHAPES)
    p.add_argument("--costs", nargs="+", default=["uniform", "untrained", "trained"],
                   choices=("uniform", "untrained", "trained"))
    p.add_argument("--warps", nargs="+", default=["1", "2", "4", "8"], choices=("1", "2", "4", "8"))
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--device", default="cuda", help="cuda (cpu: a smoke test; the switch is CUDA's)")
    p.add_argument("--out", help="write every run's record, in order, as JSON")
    args = p.parse_args(argv)
    runs = [(w, run(w, args)) for w in ["default", *args.warps, "default"]]
    env = runs[0][1]["environment"]
    print(f"lsap_registers (default) against lsap_warps: {env.get('gpu') or env.get('cpu')}, torch {env['torch']}, "
          f"{env['date']}; median ms, and the default's over it")
    print("\n".join(table(runs)))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(args=vars(args), runs=[dict(warps=w, record=r) for w, r in runs]), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
