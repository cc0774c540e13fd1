"""A loss call of a DETR-style matcher in the common pattern (tests/detr_matchers.py: the cost of every query against
every object of the batch on the device, ``.cpu()``, split by the images' object counts, SciPy per image), its own
against patched by lucid_assign.integrations.detr, as a DETR loss calls it: once per decoder layer.

    python bench/detr_pattern.py --device cuda                       # batch 16 and 32, 10 / 50 / 200 objects
    python bench/detr_pattern.py --device cuda --pageable            # the copies into pageable memory, as .cpu()
    python bench/detr_pattern.py --device cpu --batch 16 --calls 3   # the 2-core VM
    python bench/detr_pattern.py --device cpu --batch 2 --objects 5 --layers 2 --calls 1   # smoke test

Per case: ``--layers`` layers of predictions (300 queries, 80 classes, boxes and logits drawn per layer), the
matcher called on each layer in turn; a loss call is timed from an idle device to the end of its last matcher call,
the median of ``--calls`` loss calls after one warm-up, own and patched alternating. "cost + copy" is the part both
share (the matcher's cost and its copy to the host, each layer). Every call's matches are compared, own against
patched; the op's solves and SciPy's are counted per loss call. ``--out`` writes the record as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import detr_matchers as dm  # noqa: E402
from _runs import sync  # noqa: E402

from lucid_assign.bench import environment  # noqa: E402
from lucid_assign.integrations import detr  # noqa: E402


def loss_inputs(layers: int, batch: int, objects: int, device, queries: int, classes: int) -> tuple:
    """Each layer's outputs (its own draw) and the batch's targets."""
    per_layer = [dm.batch([objects] * batch, queries=queries, classes=classes, seed=layer) for layer in range(layers)]
    targets = [{k: v.to(device) for k, v in t.items()} for t in per_layer[0][1]]
    outputs = [{k: v.to(device) for k, v in o.items()} for o, _ in per_layer]
    return outputs, targets


def loss_call(m, outputs: list, targets: list, device) -> tuple:
    """(seconds, every layer's matches) of one loss call's matcher calls, from an idle device."""
    sync(device)
    t = time.perf_counter()
    found = [m(o, targets) for o in outputs]
    sync(device)
    return time.perf_counter() - t, found


def cost_and_copy(m, outputs: list, targets: list, device) -> float:
    sync(device)
    t = time.perf_counter()
    with torch.no_grad():
        for o in outputs:
            m.cost(o, targets).cpu()
    sync(device)
    return time.perf_counter() - t


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.device == b.device and torch.equal(a, b)
    return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))


def case(batch: int, objects: int, args) -> dict:
    m = dm.SoftmaxMatcher()
    outputs, targets = loss_inputs(args.layers, batch, objects, args.device, args.queries, args.classes)
    times = {"own": [], "patched": [], "cost + copy": []}
    agree = True
    for k in range(args.calls + 1):  # the first of each: warm-up
        order = ("own", "patched") if k % 2 == 0 else ("patched", "own")
        found = {}
        for variant in order:
            if variant == "patched":
                with detr.patched(dm.SoftmaxMatcher, args.backend), dm.counting() as solves:
                    seconds, found[variant] = loss_call(m, outputs, targets, args.device)
            else:
                seconds, found[variant] = loss_call(m, outputs, targets, args.device)
            if k:
                times[variant].append(seconds)
        agree = agree and same(found["own"], found["patched"])
        if k:
            times["cost + copy"].append(cost_and_copy(m, outputs, targets, args.device))
    medians = {k: statistics.median(v) for k, v in times.items()}
    return dict(batch=batch, objects=objects, layers=args.layers, queries=args.queries, times=times,
                median_ms={k: 1e3 * v for k, v in medians.items()}, speedup=medians["own"] / medians["patched"],
                op_calls=solves["op"], scipy_calls=solves["scipy"], same=agree)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch", type=int, nargs="+", default=[16, 32])
    p.add_argument("--objects", type=int, nargs="+", default=[10, 50, 200])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--queries", type=int, default=300)
    p.add_argument("--classes", type=int, default=80)
    p.add_argument("--calls", type=int, default=5, help="timed loss calls per variant (after one warm-up)")
    p.add_argument("--backend", default="auto")
    p.add_argument("--pageable", action="store_true",
                   help="the patched forward's copies of CUDA costs into pageable memory, as .cpu() makes them "
                        "(detr.PAGE_LOCKED off)")
    p.add_argument("--out", help="write the record as JSON")
    args = p.parse_args()
    detr.PAGE_LOCKED = not args.pageable
    env = environment()
    locked = ", copies pageable" if args.pageable else ""
    print(f"DETR-pattern matcher, a loss call of {args.layers} layers, {args.queries} queries, {args.classes} "
          f"classes{locked}, device {args.device} ({env['gpu'] or env['cpu']}, {env['cpu_threads']} CPU threads), "
          f"torch {env['torch']}, {env['date']}, commit {env['commit']}", flush=True)
    print(f"{'batch':>5} {'objects':>7} | {'own':>10} {'patched':>10} {'faster':>7} | {'cost + copy':>11} | "
          f"{'op / SciPy solves':>17} | same", flush=True)
    rows = []
    for batch in args.batch:
        for objects in args.objects:
            r = case(batch, objects, args)
            rows.append(r)
            t = r["median_ms"]
            print(f"{batch:>5} {objects:>7} | {t['own']:8.2f}ms {t['patched']:8.2f}ms {r['speedup']:6.1f}x | "
                  f"{t['cost + copy']:9.2f}ms | {r['op_calls']:>8} / {r['scipy_calls']:<6} | "
                  f"{'yes' if r['same'] else 'NO'}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            given = {k: v for k, v in vars(args).items() if k not in ("out", "pageable")}
            json.dump(dict(environment=env, args=given | dict(page_locked=detr.PAGE_LOCKED), cases=rows), f,
                      indent=1)
    return 0 if all(r["same"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
