"""What a DETR family's loss call costs the host in its matcher: the tensor operations dispatched, the host
synchronisations and the Python time of every matcher call of one loss call, the family's own matcher against the
patched one (lucid_assign.integrations.transformers), on the CPU (the op's CPU kernel) or a GPU.

    python bench/matcher_ops.py                          # rt-detr, detr, deformable-detr, lw-detr, rf-detr
    python bench/matcher_ops.py --families detr --imgsz 320 --batch 1 --objects 2   # smoke test
    python bench/matcher_ops.py --families rf-detr --precision float32   # RF-DETR's batched path (alike dtypes)

Each transformers family's model comes from its default config (bench/train_step_transformers.py's build: RT-DETR,
DETR with auxiliary losses, Deformable DETR two-stage with refinement, LW-DETR), no weights, 80 classes, 640 px; a
forward with labels under bf16 autocast computes its loss, which calls the matcher once per decoder layer (and for the
encoder's proposals). RF-DETR Small comes from its rfdetr config (bench/train_step_rfdetr.py's build: 90 classes, its
512 px), its loss the criterion of its forward under bf16 autocast, which matches every layer in one call of the
matcher's _match_many (RF-DETR's own declines where the layers' dtypes differ, and calls each layer's forward). After
two warm-up loss calls (the patched matcher checks itself and each kind of call at the first; the
second makes what later steps reuse), one loss call is counted, each loss call on a new batch (as a step's):
every operation dispatched inside the matcher's calls (a TorchDispatchMode: what each launches or computes on the
host), the synchronisations among them (reading a value on the host: ``item``, ``.cpu()`` and ``.numpy()``,
``nonzero``; on CUDA each waits for the device), and the calls' time. The goal of the issue "The DETR cost in one
launch": 12 operations or fewer per loss call, one synchronisation at most, whatever the layers.

    python bench/matcher_ops.py --device cuda --batch 16 --objects 10 200 --profile   # where a patched call's time goes

``--profile``: the patched matcher's calls of one loss call, taken as the loss made them and made again, each between
two synchronisations: each call's time without the profiler (the median of 20), then under torch.profiler each call's
time, the host time of each part of the patched path (the regions below) and the device time of each kernel.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import statistics
import sys
import time
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _runs import detr_batch, sync  # noqa: E402
from train_step_transformers import FAMILIES, around_matcher, build  # noqa: E402

from lucid_assign.integrations import _matching as core  # noqa: E402
from lucid_assign.integrations import rfdetr as lr  # noqa: E402
from lucid_assign.integrations import transformers as lt  # noqa: E402

RFDETR = "rf-detr"  # RF-DETR Small in its own trainer's criterion

SYNCS = {"aten::_local_scalar_dense", "aten::nonzero", "aten::is_nonzero", "aten::equal", "aten::masked_select",
         "aten::unique_consecutive", "aten::_unique2"}  # operations that read a device value on the host


class _Count(TorchDispatchMode):
    def __init__(self, ops: Counter):
        super().__init__()
        self.ops = ops

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func._schema.name] += 1
        if (func is torch.ops.aten._to_copy.default and isinstance(args[0], torch.Tensor)
                and args[0].device.type != "cpu" and torch.device((kwargs or {}).get("device") or "cpu").type == "cpu"):
            self.ops["(device to host)"] += 1  # a read of the device: Tensor.cpu, or tolist's copy
        return func(*args, **(kwargs or {}))


def counted(name: str, device, found: dict):
    """Every call of the matcher class's forward (patched or not) in the block: its operations, its copies to the
    host and its time, added up in ``found``."""

    def on_host(tensor, args, kwargs):  # Tensor.cpu in a matcher call
        found["host copies"] += 1
        return core.HOST_COPY.own(tensor, *args, **kwargs)

    def around(inner, self, *args, **kwargs):
        sync(device)
        t0 = time.perf_counter()
        with _Count(found["ops"]), core.HOST_COPY.handled(on_host):
            out = inner(self, *args, **kwargs)
        sync(device)
        found["seconds"] += time.perf_counter() - t0
        found["calls"] += 1
        return out

    return (around_rfdetr if name == RFDETR else around_matcher)(name, around)


@contextlib.contextmanager
def around_rfdetr(_, around):
    """Each outermost call of RF-DETR's matcher (its _match_many, or a layer's forward where the criterion calls it)
    made as ``around(method, self, *args, **kwargs)``."""
    from rfdetr.models.matcher import HungarianMatcher as cls

    saved, inside = (cls._match_many, cls.forward), [0]

    def wrapped(inner):
        def call(self, *args, **kwargs):
            if inside[0]:
                return inner(self, *args, **kwargs)
            inside[0] += 1
            try:
                return around(inner, self, *args, **kwargs)
            finally:
                inside[0] -= 1
        return call

    cls._match_many, cls.forward = wrapped(saved[0]), wrapped(saved[1])
    try:
        yield
    finally:
        cls._match_many, cls.forward = saved


def _batches(args, imgsz: int, objects: int, classes: int, label_key: str):
    """Synthetic batches, a new one (images and targets) at each next(), as a training step's."""
    for seed in itertools.count():
        yield detr_batch(args.batch, imgsz, objects, seed, args.device, classes, label_key)


def setup(family: str, args, objects: int):
    """(a loss call: a function of no argument, the patch's context) of a family's model, each call on a new synthetic
    batch."""
    device = args.device
    region = torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=args.precision == "bf16")
    if family == RFDETR:
        from rfdetr.utilities.tensors import NestedTensor
        from train_step_rfdetr import CLASSES, build as build_rfdetr

        model, criterion, _, imgsz = build_rfdetr("small", args.imgsz, device)
        batches = _batches(args, imgsz, objects, CLASSES, "labels")
        mask = torch.zeros(args.batch, imgsz, imgsz, dtype=torch.bool, device=device)

        def loss():
            images, targets = next(batches)
            with region:
                return criterion(model(NestedTensor(images, mask)), targets)

        lr._verified.clear()
        return loss, lr.patched("kernel")
    model, _ = build(family, device)
    batches = _batches(args, args.imgsz or 640, objects, 80, "class_labels")

    def loss():
        images, labels = next(batches)
        with region:
            return model(pixel_values=images, labels=labels).loss

    lt._verified.clear()
    lt._blocks_ok.clear()
    return loss, lt.patched("kernel")


def count(family: str, patched: bool, args, objects: int) -> dict:
    loss_call, context = setup(family, args, objects)
    found = dict(ops=Counter(), calls=0, seconds=0.0, **{"host copies": 0})
    with context if patched else contextlib.nullcontext():
        for _ in range(2):  # the first checks the class and each kind of call; the second makes what steps reuse
            loss_call()
        with counted(FAMILIES.get(family, family), args.device, found):
            loss_call()
    ops = found["ops"]
    reads = ops.pop("(device to host)", 0) if torch.device(args.device).type != "cpu" else found["host copies"]
    syncs = sum(n for name, n in ops.items() if name in SYNCS) + reads
    return dict(family=family, patched=patched, objects=objects, calls=found["calls"], ops=sum(ops.values()),
                syncs=syncs, ms=1e3 * found["seconds"], top=ops.most_common(6))


# the parts of the patched path timed by --profile: module, attribute
REGIONS = [(lt, "_blocks_usable"), (core, "layout"), (lt, "_objects_of"), (lt, "_dtype_plan"), (lt, "_op_problems"),
           (core, "layer_of"), (core, "_keyed"), (core, "solve"), (core, "matches"), (core, "settle"),
           (core.Memo, "take"), (core, "served_again"), (core, "raise_refused")]


@contextlib.contextmanager
def _regions():
    """Each part of REGIONS inside a torch.profiler.record_function of its name."""
    saved = [(owner, name, getattr(owner, name)) for owner, name in REGIONS]

    def timed(name, f):
        def inner(*args, **kwargs):
            with torch.profiler.record_function(name):
                return f(*args, **kwargs)
        return inner

    try:
        for owner, name, f in saved:
            setattr(owner, name, timed(name, f))
        yield
    finally:
        for owner, name, f in saved:
            setattr(owner, name, f)


def profile(family: str, args, objects: int) -> None:
    """The patched matcher's calls of one loss call (their arguments as the loss passed them, kept, and the outputs the
    loss call in progress will match: core.loss_call), made again under torch.profiler: each call's time between
    synchronisations, the host time of each region, each kernel's time."""
    from torch.profiler import ProfilerActivity

    loss_call, context = setup(family, args, objects)
    calls, outputs = [], {}

    def keep(inner, self, *a, **k):
        calls.append((inner, self, a, k))
        outputs.setdefault(id(self), (self, core._loss_inputs(self)))
        return inner(self, *a, **k)

    def as_the_loss():  # the replay inside the loss calls it was made in (one solve for all, as there)
        stack = contextlib.ExitStack()
        for m, inputs in outputs.values():
            if inputs:
                stack.enter_context(core.loss_call(m, inputs))
        return stack

    region = torch.autocast(torch.device(args.device).type, dtype=torch.bfloat16,
                            enabled=args.precision == "bf16")  # the loss's, as loss_call's

    with context:
        loss_call()
        loss_call()
        with (around_rfdetr if family == RFDETR else around_matcher)(FAMILIES.get(family, family), keep):
            loss_call()
        bare = [[] for _ in calls]  # the replay outside the profiler, warm: each call's time, 20 times
        for _ in range(21):
            with region, as_the_loss():
                for i, (inner, self, a, k) in enumerate(calls):
                    sync(args.device)
                    t0 = time.perf_counter()
                    inner(self, *a, **k)
                    sync(args.device)
                    bare[i].append(time.perf_counter() - t0)
        spans = []
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.device(args.device).type == "cuda"
                                               else [])
        with region, as_the_loss(), _regions(), torch.profiler.profile(activities=activities) as prof:
            for i, (inner, self, a, k) in enumerate(calls):
                sync(args.device)
                t0 = time.perf_counter()
                with torch.profiler.record_function(f"matcher call {i}"):
                    inner(self, *a, **k)
                sync(args.device)
                spans.append(time.perf_counter() - t0)
    medians = [statistics.median(times[1:]) for times in bare]
    print(f"{family}, {objects} objects per image, batch {args.batch}: {len(calls)} calls, without the profiler "
          f"{1e3 * sum(medians):.3f} ms in all: " + ", ".join(f"{1e3 * s:.3f}" for s in medians)
          + f" ms (medians of 20); under it {1e3 * sum(spans):.3f} ms: " + ", ".join(f"{1e3 * s:.3f}" for s in spans)
          + " ms")
    events = prof.key_averages()
    names = {name for _, name in REGIONS}
    print("    host, ms (calls): " + ", ".join(f"{e.key} {e.cpu_time_total / 1e3:.3f} ({e.count})" for e in
                                             sorted(events, key=lambda e: -e.cpu_time_total) if e.key in names))
    kernels = [e for e in events if getattr(e, "device_type", None) is not None and e.device_type.name == "CUDA"
               and e.key not in names and not e.key.startswith("matcher call")]  # kernels, not the regions' spans
    total = lambda e: getattr(e, "self_device_time_total", 0) or getattr(e, "self_cuda_time_total", 0)  # noqa: E731
    if kernels:
        print(f"    device, ms (launches), {sum(total(e) for e in kernels) / 1e3:.3f} in all: " + ", ".join(
            f"{e.key[:60]} {total(e) / 1e3:.3f} ({e.count})" for e in sorted(kernels, key=lambda e: -total(e))[:8]))


def _precision(args) -> str:
    return "bf16 autocast" if args.precision == "bf16" else "float32"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--families", nargs="+", choices=[*FAMILIES, RFDETR], default=[*FAMILIES, RFDETR])
    p.add_argument("--imgsz", type=int, default=None, help="the images' side (default: 640, RF-DETR's own 512)")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--objects", type=int, nargs="+", default=[10])
    p.add_argument("--top", action="store_true", help="also the most dispatched operations of each")
    p.add_argument("--profile", action="store_true", help="where each patched call's time goes (torch.profiler)")
    p.add_argument("--precision", choices=("bf16", "float32"), default="bf16",
                   help="the forward and loss under bf16 autocast (as trained), or in float32")
    p.add_argument("--cost-op", choices=("on", "off", "default"), default="default",
                   help="the patched matchers' cost by the detr_cost ops on this device, or not (default: "
                        "transformers.FAMILY_COST_DEVICES, rfdetr.COST_DEVICES)")
    args = p.parse_args(argv)
    if args.cost_op != "default":
        here = torch.device(args.device).type
        lt.FAMILY_COST_DEVICES = tuple(d for d in lt.FAMILY_COST_DEVICES if d != here) + (
            (here,) if args.cost_op == "on" else ())
        lr.COST_DEVICES = tuple(d for d in lr.COST_DEVICES if d != here) + ((here,) if args.cost_op == "on" else ())
    import transformers

    if args.profile:
        print(f"the patched matcher's calls of one loss call under torch.profiler, {_precision(args)}, {args.device}, "
              f"torch {torch.__version__}, transformers {transformers.__version__}")
        for family in args.families:
            for objects in args.objects:
                profile(family, args, objects)
        return 0
    print(f"matcher calls of one loss call, batch {args.batch} at {args.imgsz or 'the default'} px, "
          f"{args.objects[0]} objects per image, "
          f"{_precision(args)}, {args.device}, torch {torch.__version__}, transformers {transformers.__version__}, "
          f"the cost op on {', '.join(lt.FAMILY_COST_DEVICES) or 'no device'} (RF-DETR's on "
          f"{', '.join(lr.COST_DEVICES) or 'no device'})")
    print(f"{'family':<16} {'matcher':<8} {'calls':>5} {'ops':>6} {'syncs':>5} {'ms':>9}")
    for family in args.families:
        for patched in (False, True):
            r = count(family, patched, args, args.objects[0])
            print(f"{family:<16} {'patched' if patched else 'own':<8} {r['calls']:>5} {r['ops']:>6} {r['syncs']:>5} "
                  f"{r['ms']:>9.2f}", flush=True)
            if args.top:
                print("    " + ", ".join(f"{name} {n}" for name, n in r["top"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
