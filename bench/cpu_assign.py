"""CPU benchmark of the fused assign kernel against the reference: time and peak memory.

    python bench/cpu_assign.py                     # OBB, batch 4 at 1024 px (21,504 anchors), 15 classes, 200 objects
    python bench/cpu_assign.py --objects 50 --hbb

Each backend runs in a fresh subprocess. Peak memory is the growth of the process's peak resident set (VmHWM, reset
through /proc/self/clear_refs just before the call) over its resident set at that moment: what the call itself adds,
outputs included.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def child(args):
    import torch

    sys.path.insert(0, ROOT)
    import lucid_assign
    from lucid_assign.synthetic import dota_like_batch

    b = dota_like_batch(batch=args.batch, img_size=args.img_size, num_classes=args.classes, objects=args.objects,
                        obb=not args.hbb, seed=args.seed)
    inputs = [b[k] for k in lucid_assign.reference.INPUTS]
    kw = dict(topk=args.topk, num_classes=args.classes, stride=b["stride"], backend=args.backend)
    # peak memory of one call
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = _status("VmRSS")
    out = lucid_assign.assign(*inputs, **kw)
    peak = _status("VmHWM") - base
    del out
    times = []
    for _ in range(args.reps):
        start = time.perf_counter()
        lucid_assign.assign(*inputs, **kw)
        times.append(time.perf_counter() - start)
    print(json.dumps(dict(backend=args.backend, median_s=statistics.median(times), min_s=min(times),
                          max_s=max(times), peak_bytes=peak, threads=torch.get_num_threads())))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--img-size", type=int, default=1024)
    p.add_argument("--classes", type=int, default=15)
    p.add_argument("--objects", type=int, default=200)
    p.add_argument("--topk", type=int, default=10)
    p.add_argument("--hbb", action="store_true")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", default=None, help=argparse.SUPPRESS)  # set in the subprocess
    args = p.parse_args(argv)
    if args.backend:
        return child(args)
    rows = []
    for backend in ("reference", "kernel"):
        cmd = [sys.executable, os.path.abspath(__file__), *(argv if argv is not None else sys.argv[1:]),
               "--backend", backend]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode:
            sys.exit(res.stderr)
        rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
    ref = rows[0]
    print(f"{'OBB' if not args.hbb else 'HBB'}, batch {args.batch} at {args.img_size} px, {args.classes} classes, "
          f"{args.objects} objects/image, topk {args.topk}, CPU threads {ref['threads']}")
    print(f"{'backend':<10} {'median ms':>10} {'min ms':>9} {'max ms':>9} {'peak MiB':>9} {'speed-up':>9} "
          f"{'memory':>8}")
    for r in rows:
        print(f"{r['backend']:<10} {r['median_s'] * 1e3:>10.1f} {r['min_s'] * 1e3:>9.1f} {r['max_s'] * 1e3:>9.1f} "
              f"{r['peak_bytes'] / 2**20:>9.1f} {ref['median_s'] / r['median_s']:>8.1f}x "
              f"{r['peak_bytes'] / max(ref['peak_bytes'], 1):>8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
