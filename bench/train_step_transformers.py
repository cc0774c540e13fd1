"""Training-step benchmark of a transformers DETR-family model with and without
lucid_assign.integrations.transformers.patch(), in one run.

    python bench/train_step_transformers.py                       # GPU: RT-DETR, batch 16 at 640 px, bf16 autocast
    python bench/train_step_transformers.py --family deformable-detr   # also detr, lw-detr (at batch 4)
    python bench/train_step_transformers.py --family rt-detr detr deformable-detr lw-detr --out \
        docs/bench-step-transformers.json                         # the record the README's rows come from
    python bench/train_step_transformers.py --device cpu --imgsz 128 --batch 2 --objects 5 --steps 2 --warmup 1

The model comes from its default config (RTDetrForObjectDetection; LwDetrForObjectDetection with one projector level,
which needs 640 px or more, and whose own loss outgrows 80 GB at batch 16; DetrForObjectDetection with its auxiliary
losses and DeformableDetrForObjectDetection, two-stage with box refinement and auxiliary losses, each with a ResNet-50
backbone config in place of timm), 80 classes, no weights. Each step is a forward pass with labels under bf16
autocast (the loss matches queries to objects once per decoder layer, and once for the encoder's proposals where
the model has them), backward and an SGD step, on DOTA-like axis-aligned objects (lucid_assign.synthetic). Both
variants are built from one seed and their steps alternate. It reports the median step time and, from separate
instrumented steps, the matcher's time: every call timed between two device synchronisations (its host work and its
GPU work, overlapped with nothing: an upper bound of its cost in the step), and its share of the step; and the median
time of each of the patched matcher's calls (the loss call's first, which solves every layer, then the others).

``--profile``: one more patched step, under torch.profiler, whose matcher calls are timed as above: for the first call
and for the others together, the host time of each part of the patched path (bench/matcher_ops.py's regions), the time
of the kernels they launched and of the garbage collections inside them; where a call's time goes in a step, not in
calls made again on their own (bench/matcher_ops.py --profile).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _runs import alternated, detr_batch, paired_case, sync  # noqa: E402
from lucid_assign.integrations import transformers as lt  # noqa: E402

FAMILIES = {"rt-detr": "RTDetrHungarianMatcher", "deformable-detr": "DeformableDetrHungarianMatcher",
            "detr": "HungarianMatcher", "lw-detr": "LwDetrHungarianMatcher"}


def build(family: str, device):
    import transformers as tf

    torch.manual_seed(0)
    if family == "rt-detr":
        model = tf.RTDetrForObjectDetection(tf.RTDetrConfig(num_labels=80))
    elif family == "lw-detr":
        model = tf.LwDetrForObjectDetection(tf.LwDetrConfig(num_labels=80, projector_scale_factors=[1.0]))
    elif family == "detr":
        config = tf.DetrConfig(num_labels=80, use_timm_backbone=False, use_pretrained_backbone=False,
                               backbone_config=tf.ResNetConfig(out_features=["stage4"]), auxiliary_loss=True)
        model = tf.DetrForObjectDetection(config)
    else:
        config = tf.DeformableDetrConfig(num_labels=80, use_timm_backbone=False, use_pretrained_backbone=False,
                                         backbone_config=tf.ResNetConfig(out_features=["stage2", "stage3", "stage4"]),
                                         two_stage=True, with_box_refine=True, auxiliary_loss=True)
        model = tf.DeformableDetrForObjectDetection(config)
    model.to(device).train()
    return model, torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)


def step(model, opt, images, labels, device):
    with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
        loss = model(pixel_values=images, labels=labels).loss
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.detach()


@contextlib.contextmanager
def around_matcher(name: str, around):
    """Each call of the matcher class's forward (patched or not) made as ``around(forward, self, *args, **kwargs)``."""
    cls = next(c for n, c in lt._classes().items() if n == name)
    inner = cls.forward

    def forward(self, *args, **kwargs):
        return around(inner, self, *args, **kwargs)

    cls.forward = forward
    try:
        yield
    finally:
        cls.forward = inner


def timed_matcher(name: str, device, spans: list):
    """Each call of the matcher class's forward, timed between two synchronisations (appended to ``spans``)."""

    def around(inner, self, *args, **kwargs):
        sync(device)
        t0 = time.perf_counter()
        out = inner(self, *args, **kwargs)
        sync(device)
        spans.append(time.perf_counter() - t0)
        return out

    return around_matcher(name, around)


def _descendants(event):
    stack = list(event.cpu_children)
    while stack:
        e = stack.pop()
        yield e
        stack.extend(e.cpu_children)


def profiled_step(family: str, model, opt, batch, device) -> list:
    """One patched step under torch.profiler, each matcher call timed between two synchronisations: where the first
    call's time goes and the others' (lines to print)."""
    from torch.profiler import ProfilerActivity

    from matcher_ops import REGIONS, _regions

    spans, collections, inside = [], [], [False]

    def collected(phase, info):  # the garbage collector's passes inside a matcher call
        if inside[0]:
            collections.append((phase, time.perf_counter()))

    def around(inner, self, *args, **kwargs):
        sync(device)
        inside[0], t0 = True, time.perf_counter()
        with torch.profiler.record_function(f"matcher call {len(spans)}"):
            out = inner(self, *args, **kwargs)
        sync(device)
        inside[0] = False
        spans.append(time.perf_counter() - t0)
        return out

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.device(device).type == "cuda" else [])
    gc.callbacks.append(collected)
    try:
        with _regions(), around_matcher(FAMILIES[family], around), torch.profiler.profile(activities=activities) as p:
            step(model, opt, *batch, device)
            sync(device)
    finally:
        gc.callbacks.remove(collected)
    names, lines = {name for _, name in REGIONS}, []
    calls = sorted((e for e in p.events() if e.name.startswith("matcher call") and e.device_type.name == "CPU"),
                   key=lambda e: int(e.name.split()[-1]))
    for label, group in (("the first call", calls[:1]), ("the others", calls[1:])):
        if not group:
            continue
        regions: dict = {}
        for e in (d for c in group for d in _descendants(c) if d.name in names):
            regions[e.name] = regions.get(e.name, 0.0) + e.cpu_time_total / 1e3
        kernels = sum(c.device_time_total if hasattr(c, "device_time_total") else c.cuda_time_total
                      for c in group) / 1e3
        host = sum(c.cpu_time_total for c in group) / 1e3
        lines.append(f"{'':>30} profiled, {label}: {host:.3f} ms on the host (" + ", ".join(
            f"{k} {v:.3f}" for k, v in sorted(regions.items(), key=lambda kv: -kv[1])) + f"), kernels {kernels:.3f} ms")
    starts = [t for phase, t in collections if phase == "start"]
    stops = [t for phase, t in collections if phase == "stop"]
    lines.append(f"{'':>30} profiled: the calls {' '.join(f'{t * 1e3:.3f}' for t in spans)} ms; the garbage "
                 f"collector {len(starts)} times inside them, {sum(b - a for a, b in zip(starts, stops)) * 1e3:.3f} ms")
    return lines


def batch_of(family: str, batch: int | None) -> int:
    """The batch of a family's steps: ``--batch``, else 16 (LW-DETR 4: its own loss outgrows 80 GB at 16)."""
    return batch if batch is not None else 4 if family == "lw-detr" else 16


def measure(args, family: str, objects: int) -> list:
    device, batch = args.device, batch_of(family, args.batch)
    batches = [detr_batch(batch, args.imgsz, objects, seed, device, 80, "class_labels") for seed in range(3)]
    runs = []
    for patched in (False, True):
        model, opt = build(family, device)
        runs.append(dict(patched=patched, model=model, opt=opt, times=[]))
    contexts = {False: contextlib.nullcontext, True: lambda: lt.patched("kernel")}
    for r in runs:
        with contexts[r["patched"]]():
            for i in range(args.warmup):
                step(r["model"], r["opt"], *batches[i % 3], device)
    sync(device)
    alternated(runs, args.steps, contexts, lambda r, i: step(r["model"], r["opt"], *batches[i % 3], device), device)
    for r in runs:
        per_step, calls = [], 0
        with contexts[r["patched"]]():
            for i in range(min(args.steps, 5)):
                spans = []
                with timed_matcher(FAMILIES[family], device, spans):
                    step(r["model"], r["opt"], *batches[i % 3], device)
                    sync(device)
                per_step.append(spans)
        calls = len(per_step[0])
        r.update(objects=objects, step_s=statistics.median(r["times"]),
                 matcher_s=statistics.median(sum(spans) for spans in per_step), calls=calls,
                 call_s=[statistics.median(spans[c] for spans in per_step) for c in range(calls)]
                 if all(len(spans) == calls for spans in per_step) else [])
        if args.profile and r["patched"]:
            with contexts[True]():
                r["profile"] = profiled_step(family, r["model"], r["opt"], batches[0], device)
        del r["model"], r["opt"]
    return runs


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--family", choices=list(FAMILIES), nargs="+", default=["rt-detr"])
    p.add_argument("--imgsz", type=int, default=640)
    p.add_argument("--batch", type=int, default=None, help="default: 16 (LW-DETR 4)")
    p.add_argument("--objects", type=int, nargs="+", default=[10, 50, 200])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--cost-op", choices=("on", "off", "default"), default="default",
                   help="the patched matchers' cost by torch.ops.lucid.detr_cost.family on this device, or not "
                        "(default: transformers.FAMILY_COST_DEVICES)")
    p.add_argument("--profile", action="store_true", help="one more patched step under torch.profiler: where the "
                   "matcher calls' time goes in a step")
    p.add_argument("--out", help="write the record (JSON) here")
    args = p.parse_args(argv)
    if args.cost_op != "default":
        others = tuple(d for d in lt.FAMILY_COST_DEVICES if d != torch.device(args.device).type)
        lt.FAMILY_COST_DEVICES = others + ((torch.device(args.device).type,) if args.cost_op == "on" else ())
    import transformers

    print(f"{args.imgsz} px, bf16 autocast, {args.device}, torch {torch.__version__}, transformers "
          f"{transformers.__version__}{', ' + torch.cuda.get_device_name() if args.device == 'cuda' else ''}; the "
          f"cost op on {', '.join(lt.FAMILY_COST_DEVICES) or 'no device'}")
    print(f"{'family':<16} {'batch':>5} {'objects':>7} {'matcher':<8} {'step ms':>9} {'matcher ms (calls)':>19} "
          f"{'share':>7}")
    results = []
    for family in args.family:
        for objects in args.objects:
            runs = measure(args, family, objects)
            batch = batch_of(family, args.batch)
            for r in runs:
                print(f"{family:<16} {batch:>5} {objects:>7} {'patched' if r['patched'] else 'own':<8} "
                      f"{r['step_s'] * 1e3:9.1f} {r['matcher_s'] * 1e3:13.2f} ({r['calls']}) "
                      f"{100 * r['matcher_s'] / r['step_s']:6.2f}%")
            print(f"{'':>30} the patched calls: " + " ".join(f"{t * 1e3:.3f}" for t in runs[1]["call_s"]) + " ms")
            for line in runs[1].get("profile", ()):
                print(line)
            results.append(paired_case(*runs, 30, family=family, batch=batch, imgsz=args.imgsz, objects=objects))
    if args.out:
        env = dict(torch=torch.__version__, cuda=torch.version.cuda, transformers=transformers.__version__,
                   gpu=torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                   date=datetime.date.today().isoformat(), cost_op=list(lt.FAMILY_COST_DEVICES))
        with open(args.out, "w") as f:
            json.dump(dict(environment=env, args=vars(args), results=results), f, indent=1)


if __name__ == "__main__":
    main()
