"""One RT-DETR matcher call at a time, the peer's (ultralytics) HungarianMatcher against it patched by
lucid_assign.integrations.ultralytics, as RTDETRDetectionLoss builds it (focal cost, its default gains), on one batch:
16 images x 300 queries x 80 classes, bfloat16 scores and boxes as the decoder gives them under autocast, and
``--objects`` objects per image (uniform boxes and classes).

    python bench/matcher_call.py                   # GPU: 10, 50 and 200 objects per image
    python bench/matcher_call.py --device cpu --batch 2 --objects 5 --calls 3   # smoke test

Each call starts on an idle device (synchronised before) and is timed to its end on the device (synchronised after);
"host" is the host time until the call returns. The patched call is also timed in its parts, each synchronised
(the layout of the objects, the cost, the solve and the matches' indices; the cost in one pass where the patched
matcher computes it so, which the line says), and, last, the host functions under the patched calls by self time
(torch.profiler), with the number of calls of each per matcher call.

Then, with ``--layers L`` (default 7, RT-DETR's; 0 skips it), the calls of one loss: a stack of L layers of such
predictions, matched layer by layer in the loss's order (the last layer, then the others), each call timed as above
and the L calls added up, as ``bench/train_step.py`` adds up a step's; the patched matcher matches the whole stack at
its first call.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections import defaultdict

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _runs import sync, timed  # noqa: E402
from lucid_assign import ops  # noqa: E402
from lucid_assign.integrations import _matching as core  # noqa: E402
from lucid_assign.integrations import ultralytics as integ  # noqa: E402
from lucid_assign.integrations import ultralytics_detr as detr  # noqa: E402


def inputs(batch: int, objects: int, device, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    queries, classes = 300, 80
    boxes = (torch.rand(batch, queries, 4, generator=g) * 0.5 + 0.25).bfloat16()
    scores = (torch.randn(batch, queries, classes, generator=g) * 2 - 4).bfloat16()
    gt = torch.rand(batch * objects, 4, generator=g) * 0.5 + 0.25
    cls = torch.randint(0, classes, (batch * objects,), generator=g)
    return boxes.to(device), scores.to(device), gt.to(device), cls.to(device), [objects] * batch


def stacked(layers: int, batch: int, objects: int, device, seed: int = 0):
    """A loss call's predictions: ``layers`` layers of inputs(...)'s kind, stacked as (L, B, Q, .), and the objects."""
    per_layer = [inputs(batch, objects, "cpu", seed + layer) for layer in range(layers)]
    boxes = torch.stack([p[0] for p in per_layer]).to(device)
    scores = torch.stack([p[1] for p in per_layer]).to(device)
    gt, cls, groups = per_layer[0][2:]
    return boxes, scores, gt.to(device), cls.to(device), groups


def loss_calls(matcher, stack, device) -> tuple:
    """The matcher's calls of one loss on ``stack``, in the loss's order, each timed from an idle device: (the sum of
    the calls' seconds, the matches by layer)."""
    boxes, scores, gt, cls, groups = stack
    layers = boxes.shape[0]
    found, total = {}, 0.0
    for layer in [layers - 1, *range(layers - 1)]:
        total += timed(lambda k=layer: found.setdefault(k, matcher(boxes[k], scores[k], gt, cls, groups)), device)[1]
    return total, found


def same_matches(a: list, b: list) -> bool:
    return all(torch.equal(i.cpu(), k.cpu()) and torch.equal(j.cpu(), m.cpu()) for (i, j), (k, m) in zip(a, b))


def parts(matcher, args, device) -> dict:
    """The patched call's parts, each between two synchronisations (seconds)."""
    boxes, scores, gt, cls, groups = args
    out = {}
    t = timed(lambda: out.setdefault("where", detr.layout(groups, scores.shape[1], 1, scores.device)), device)[1]
    where = out["where"]
    order = detr._fused_order(matcher, matcher.variant, boxes, scores, gt, cls, groups, "kernel")
    c = timed(lambda: out.setdefault("cost", matcher.cost(boxes, scores, gt, cls, where, order)), device)[1]
    cost = out["cost"]
    s = timed(lambda: out.setdefault("solved", ops.linear_sum_assignment(cost, where.sizes)), device)[1]
    rows, cols, _ = out["solved"]
    i = timed(lambda: core.matches(rows, cols, where, batch_objects=True), device)[1]
    return dict(layout=t, cost=c, solve=s, indices=i)


def profile(matcher, args, device, calls: int = 10) -> None:
    acts = [torch.profiler.ProfilerActivity.CPU]
    if torch.device(device).type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(calls):
            with torch.profiler.record_function("matcher call"):
                matcher(*args)
            sync(device)
    top = [e for e in prof.events() if e.name == "matcher call" and str(e.device_type).endswith("CPU")]
    self_us, count, stack = defaultdict(float), defaultdict(int), list(top)
    while stack:
        e = stack.pop()
        self_us[e.name] += e.self_cpu_time_total
        count[e.name] += 1
        stack.extend(e.cpu_children)
    n = max(len(top), 1)
    print(f"    profiled: {sum(e.cpu_time_total for e in top) / n:.0f} us of host time per call; self time per call:")
    for name, t in sorted(self_us.items(), key=lambda kv: -kv[1])[:16]:
        print(f"      {t / n:8.1f} us  {count[name] / n:5.1f} x  {name[:80]}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--objects", type=int, nargs="+", default=[10, 50, 200])
    p.add_argument("--calls", type=int, default=20, help="timed calls per case")
    p.add_argument("--no-profile", dest="profile", action="store_false", help="skip the profiler's breakdown")
    p.add_argument("--layers", type=int, default=7, help="time a loss's calls on a stack of this many layers (0: no)")
    args = p.parse_args(argv)
    device = args.device
    from ultralytics.models.utils.loss import RTDETRDetectionLoss

    peer = RTDETRDetectionLoss(nc=80).matcher
    with integ.patched():
        patched = RTDETRDetectionLoss(nc=80).matcher
        if not isinstance(patched, detr.LucidHungarianMatcher):
            raise SystemExit(f"the matcher was not patched: {integ.patch_report()}")
        print(f"matcher calls, batch {args.batch} x 300 queries x 80 classes, {device}, torch {torch.__version__}"
              f"{', ' + torch.cuda.get_device_name() if torch.device(device).type == 'cuda' else ''}; "
              f"variant {type(patched).variant}")
        for objects in args.objects:
            batch = inputs(args.batch, objects, device)
            same = same_matches(patched(*batch), peer(*batch))
            for fn in (lambda: patched(*batch), lambda: peer(*batch)):
                fn()  # warm
            times = {name: [timed(lambda f=f: f(*batch), device) for _ in range(args.calls)]
                     for name, f in (("peer", peer), ("patched", patched))}
            split = [parts(patched, batch, device) for _ in range(args.calls)]
            row = "  ".join(f"{name} {statistics.median(t[1] for t in ts) * 1e3:.3f} ms "
                            f"(host {statistics.median(t[0] for t in ts) * 1e3:.3f})" for name, ts in times.items())
            print(f"  {objects:>4} objects: {row}; same matches: {same}")
            fused = [order for key, order in detr._FUSED.items() if key[0] == str(batch[1].device)]
            how = (f"one pass, torch.ops.lucid.detr_cost (L1 order {fused[0]})" if fused and fused[0] is not None
                   else "the peer's PyTorch operations")
            print(f"    patched, cost by {how}; by part (ms): " + ", ".join(
                f"{k} {statistics.median(s[k] for s in split) * 1e3:.3f}" for k in split[0]))
            if args.profile:
                profile(patched, batch, device)
            if args.layers > 0:
                stack = stacked(args.layers, args.batch, objects, device)
                took = {name: [loss_calls(m, stack, device) for _ in range(args.calls + 1)][1:]
                        for name, m in (("peer", peer), ("patched", patched))}
                same = all(same_matches(took["patched"][0][1][k], took["peer"][0][1][k]) for k in range(args.layers))
                print(f"    a loss's {args.layers} calls on a stack of {args.layers} layers: " + "  ".join(
                    f"{name} {statistics.median(t for t, _ in runs) * 1e3:.3f} ms" for name, runs in took.items())
                    + f"; same matches in every layer: {same}")


if __name__ == "__main__":
    main()
