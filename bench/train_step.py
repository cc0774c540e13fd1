"""Training-step benchmark of the peer trainer's yolo26n-obb, -pose or -seg, or rtdetr-l, with and without lucid-assign,
in one run.

    python bench/train_step.py                # GPU: OBB, batch 16 at 1024 px, bf16 autocast, 60 and 300 objects
    python bench/train_step.py --dense        # a dense scene: 2,000 and 5,000 small objects (4-60 px) per image
    python bench/train_step.py --task pose    # yolo26n-pose, batch 16 at 640 px, 17 keypoints, 20 and 100 people
    python bench/train_step.py --task seg     # yolo26n-seg, batch 16 at 640 px, 80 classes, 20 and 100 objects
    python bench/train_step.py --task rtdetr  # rtdetr-l, batch 16 at 640 px, 80 classes, 10, 50 and 200 objects
    python bench/train_step.py --task seg --profile --trace seg   # also the calls' host time, and timelines
    python bench/train_step.py --device cpu --imgsz 128 --batch 2 --objects 5 --steps 3 --warmup 1   # smoke test

The model is built from its YAML (no weights). Each step is a forward pass under bf16 autocast, the loss (YOLO26's
end-to-end loss: two assignments per step), backward and an SGD step, on synthetic labels: DOTA-like for OBB
(15 classes), people with COCO's 17 keypoints for pose (synthetic.pose_batch, one class), objects with masks for
segmentation (synthetic.seg_batch, 80 classes, masks at a quarter of the image size as the peer's loader makes them,
overlapping objects drawn largest first), DOTA-like axis-aligned objects for RT-DETR (80 classes; its loss runs the
forward and matches queries to objects seven times a step: "assigner" below is then its matcher). It reports the median
step time, the peak GPU memory of a step, and the assigner's share measured in separate instrumented passes, two ways:

- synchronised: the wall time of each assigner call between two device synchronisations (its host work and its GPU
  work, neither overlapped with anything; an upper bound of its cost in the step);
- stream: the time between CUDA events recorded on the stream just before and just after each call, without any
  added synchronisation: how long the assigner occupies the GPU's timeline inside an undisturbed step (its kernels,
  plus any gap while the GPU waits for its host work, such as the peer's own synchronisations); "host ms" is the
  host time inside those calls (until they return).

Both with and without ``lucid_assign.integrations.ultralytics.patch()``: both models are built from one seed and their
steps alternate, so that both see the same state of the machine. The speed-up is the ratio of the median step times,
and, beside it, the median over the pairs of steps (step i of each variant: the same batch, one right after the
other) of their ratio, which leaves out the machine's drift from step to step.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _runs import sync  # noqa: E402
from lucid_assign.integrations import ultralytics as integ  # noqa: E402
from lucid_assign.synthetic import dota_like_batch, pose_batch, seg_batch  # noqa: E402


def labels_batch(batch: int, imgsz: int, objects: int, seed: int, device, dense: bool = False,
                 task: str = "obb") -> dict:
    """The peer's training batch: images, and per object its image index, class and normalised xywhr box. dense:
    objects of 4-60 px spread uniformly (synthetic.dense_batch) instead of the DOTA-like scene. task "pose": people
    with keypoints (synthetic.pose_batch), boxes as normalised xywh and keypoints as normalised x, y, visibility.
    task "seg": objects with masks (synthetic.seg_batch), boxes as normalised xywh and the masks as the peer's loader
    gives them by default (overlap_mask): per image one map whose pixel holds 1 + the index of the object drawn there
    (the larger objects first, so the smaller stay visible), and ``sem_masks``, the class of each pixel."""
    if task == "seg":
        s = seg_batch(batch=batch, img_size=imgsz, objects=objects, seed=seed)
        mask = s["mask_gt"][..., 0].bool()
        idx = torch.arange(batch)[:, None].expand_as(mask)[mask].float()
        x1y1, x2y2 = s["gt_bboxes"][mask].split(2, -1)
        boxes = (torch.cat(((x1y1 + x2y2) / 2, x2y2 - x1y1), -1) / imgsz).clamp(0, 1)
        maps = torch.zeros(batch, *s["gt_masks"].shape[-2:], dtype=torch.float32)
        sem = torch.zeros(batch, *s["gt_masks"].shape[-2:], dtype=torch.long)
        for b, n in enumerate(s["num_objects"]):
            x1y1, x2y2 = s["gt_bboxes"][b, :n].split(2, -1)
            for i in (x2y2 - x1y1).prod(-1).argsort(descending=True).tolist():
                maps[b][s["gt_masks"][b, i]] = i + 1
                sem[b][s["gt_masks"][b, i]] = int(s["gt_labels"][b, i, 0])
        g = torch.Generator().manual_seed(seed)
        return {"img": torch.rand(batch, 3, imgsz, imgsz, generator=g).to(device), "batch_idx": idx.to(device),
                "cls": s["gt_labels"][mask].to(device), "bboxes": boxes.to(device), "masks": maps.to(device),
                "sem_masks": sem.to(device)}
    if task == "pose":
        s = pose_batch(batch=batch, img_size=imgsz, objects=objects, seed=seed)
        mask = s["mask_gt"][..., 0].bool()
        idx = torch.arange(batch)[:, None].expand_as(mask)[mask].float()
        x1y1, x2y2 = s["gt_bboxes"][mask].split(2, -1)
        boxes = (torch.cat(((x1y1 + x2y2) / 2, x2y2 - x1y1), -1) / imgsz).clamp(0, 1)
        kpts = s["gt_kpts"][mask].clone()
        kpts[..., :2] /= imgsz
        g = torch.Generator().manual_seed(seed)
        return {"img": torch.rand(batch, 3, imgsz, imgsz, generator=g).to(device), "batch_idx": idx.to(device),
                "cls": s["gt_labels"][mask].to(device), "bboxes": boxes.to(device), "keypoints": kpts.to(device)}
    if task == "rtdetr":  # axis-aligned objects, 80 classes, boxes as normalised xywh
        s = dota_like_batch(batch=batch, img_size=imgsz, num_classes=80, objects=objects, obb=False, seed=seed)
        mask = s["mask_gt"][..., 0].bool()
        idx = torch.arange(batch)[:, None].expand_as(mask)[mask].float()
        x1y1, x2y2 = s["gt_bboxes"][mask].split(2, -1)
        boxes = (torch.cat(((x1y1 + x2y2) / 2, x2y2 - x1y1), -1) / imgsz).clamp(0, 1)
        g = torch.Generator().manual_seed(seed)
        return {"img": torch.rand(batch, 3, imgsz, imgsz, generator=g).to(device), "batch_idx": idx.to(device),
                "cls": s["gt_labels"][mask].to(device), "bboxes": boxes.to(device)}
    s = dota_like_batch(batch=batch, img_size=imgsz, num_classes=15, objects=objects, obb=True, seed=seed,
                        dense_sizes=(4.0, 60.0) if dense else None)
    mask = s["mask_gt"][..., 0].bool()
    idx = torch.arange(batch)[:, None].expand_as(mask)[mask].float()
    boxes = s["gt_bboxes"][mask].clone()
    boxes[:, :4] /= imgsz
    boxes[:, :2] = boxes[:, :2].clamp(0, 1)
    g = torch.Generator().manual_seed(seed)
    return {"img": torch.rand(batch, 3, imgsz, imgsz, generator=g).to(device), "batch_idx": idx.to(device),
            "cls": s["gt_labels"][mask].to(device), "bboxes": boxes.to(device)}


def build(device, task: str = "obb", cfg: str | None = None):
    """The peer's model for ``task`` from its YAML (``cfg``; default yolo26n-TASK.yaml, which releases before 8.4 do
    not have: pass e.g. yolov8n-obb.yaml there), with an SGD optimiser."""
    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import OBBModel, PoseModel, RTDETRDetectionModel, SegmentationModel
    from ultralytics.utils import DEFAULT_CFG

    torch.manual_seed(0)
    cfg = cfg or ("rtdetr-l.yaml" if task == "rtdetr" else f"yolo26n-{task}.yaml")
    if task == "rtdetr":
        model = RTDETRDetectionModel(cfg, nc=80, verbose=False).to(device)
        model.nc = 80  # the trainer attaches the dataset's class count
    elif task == "pose":
        model = PoseModel(cfg, nc=1, data_kpt_shape=(17, 3), verbose=False).to(device)
    elif task == "seg":
        model = SegmentationModel(cfg, nc=80, verbose=False).to(device)
    else:
        model = OBBModel(cfg, nc=15, verbose=False).to(device)
    model.args = get_cfg(DEFAULT_CFG)
    model.train()
    return model, torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9)


def step(model, opt, batch, device):
    """One training step as the peer's trainer runs it: forward and loss under bf16 autocast, backward, SGD step.
    Returns the loss and its items as the loss returns them (flattened by the caller that wants them)."""
    with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
        if type(model).__name__ == "RTDETRDetectionModel":  # its loss runs the forward (denoising needs the labels)
            loss, items = model.loss(batch)
        else:
            loss, items = model.loss(batch, model(batch["img"]))
    opt.zero_grad(set_to_none=True)
    loss.sum().backward()
    opt.step()
    return loss.detach(), items


def measure(args, objects: int) -> list:
    """Both variants, unpatched and patched, built from one seed and stepped in alternation (which one goes first
    alternates too), so that both see the same conditions of the machine; then an instrumented pass of each."""
    device = args.device
    batches = [labels_batch(args.batch, args.imgsz, objects, seed, device, args.dense, args.task) for seed in range(3)]
    runs = []
    for patched in (False, True):
        with integ.patched() if patched else contextlib.nullcontext():
            model, opt = build(device, args.task)
            for i in range(args.warmup):  # the first step builds the loss, and with it the assigners
                step(model, opt, batches[i % 3], device)
        runs.append(dict(objects=objects, patched=patched, model=model, opt=opt, times=[]))
    sync(device)
    for i in range(args.steps):
        for r in runs if i % 2 == 0 else runs[::-1]:
            t0 = time.perf_counter()
            step(r["model"], r["opt"], batches[i % 3], device)
            sync(device)
            r["times"].append(time.perf_counter() - t0)
    for r in runs:
        model, opt = r.pop("model"), r.pop("opt")
        crit = model.criterion
        parts = [crit.one2many, crit.one2one] if hasattr(crit, "one2one") else [crit]
        attr = "matcher" if hasattr(crit, "matcher") else "assigner"  # RT-DETR's loss matches queries to objects
        originals = [getattr(p, attr) for p in parts]
        record = args.dump and r["patched"]
        calls = []
        inside = {}
        for mode in ("synchronised", "stream"):
            timers = [_Timed(a, device, mode, calls if record and mode == "synchronised" else None) for a in originals]
            for p, t in zip(parts, timers):
                _swap(p, attr, t)
            per_step, host = [], []
            for i in range(min(args.steps, 5)):
                step(model, opt, batches[i % 3], device)
                sync(device)
                taken = [t.take() for t in timers]
                per_step.append(sum(t[0] for t in taken))
                host.append(sum(t[1] for t in taken))
                for t in timers:  # the inputs of the first step are enough
                    t.calls = None
            inside[mode] = statistics.median(per_step)
            inside[mode + " peak"] = max(t.peak for t in timers)
            inside[mode + " host"] = statistics.median(host)
        if args.profile:
            trace = args.trace and f"{args.trace}-m{objects}-{'patched' if r['patched'] else 'peer'}.json"
            profile_assigners(model, opt, batches, device, trace)
        for p, a in zip(parts, originals):
            _swap(p, attr, a)
        if record:  # the assigners' real inputs of one step, for bench/profile_cuda.py --inputs
            path = f"{args.dump}-m{objects}.pt"
            torch.save(calls, path)
            print(f"saved the inputs of {len(calls)} assigner calls to {path}")
        peak = None
        if torch.device(device).type == "cuda":  # the peak memory of one plain step, from the state between steps
            sync(device)
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            step(model, opt, batches[0], device)
            sync(device)
            peak = torch.cuda.max_memory_allocated() - base
        r.update(step_s=statistics.median(r["times"]), assign_s=inside["synchronised"], stream_s=inside["stream"],
                 peak_b=peak, assign_peak_b=inside["synchronised peak"] if peak is not None else None,
                 host_s=inside["stream host"] if torch.device(device).type == "cuda" else None,
                 assigners=sorted({type(a).__name__ for a in originals}))
    return runs


def _swap(owner, attr: str, obj) -> None:
    """owner.attr = obj, also where attr is a submodule (RT-DETR's matcher) and obj a plain wrapper."""
    if attr in getattr(owner, "_modules", {}):
        owner._modules[attr] = obj
    else:
        setattr(owner, attr, obj)


def profile_assigners(model, opt, batches, device, trace=None):
    """Where the host time of the assigner calls goes inside a real step: torch.profiler over two steps, the CPU
    self time of everything under the calls (the assigners are wrapped by _Timed, which marks them as "assigner
    call"). trace: a path for the timeline (Chrome trace format: the calls' host work and their GPU kernels)."""
    from collections import defaultdict

    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for i in range(2):
            step(model, opt, batches[i % 3], device)
            sync(device)
    if trace:
        prof.export_chrome_trace(trace)
        print(f"  saved the timeline of two steps to {trace}")
    # the CPU-side ranges only (record_function also leaves a GPU-side annotation of the same name)
    calls = [e for e in prof.events() if e.name == "assigner call" and str(e.device_type).endswith("CPU")]
    per_name, stack = defaultdict(float), list(calls)
    while stack:
        e = stack.pop()
        per_name[e.name] += e.self_cpu_time_total
        stack.extend(e.cpu_children)
    n = max(len(calls), 1)
    print(f"  profiled: {len(calls)} assigner calls, CPU time {sum(c.cpu_time_total for c in calls) / n:.1f} us per "
          "call; self CPU time per call of what runs under them:")
    for name, t in sorted(per_name.items(), key=lambda kv: -kv[1])[:14]:
        print(f"    {t / n:8.1f} us  {name[:90]}")


class _Timed:
    """Wraps an assigner: "synchronised" mode times each call between two synchronisations (host clock), "stream"
    mode records CUDA events around each call without synchronising (read by take() after the step's own sync)."""

    def __init__(self, inner, device, mode, calls=None):
        self.inner, self.device, self.mode, self.calls = inner, device, mode, calls
        self.cuda = torch.device(device).type == "cuda"
        self.spans = []
        self.host = 0.0  # stream mode: host time inside the calls (until they return, nothing waited for)
        self.peak = 0  # synchronised mode on CUDA: the largest peak memory of a call above what it found allocated

    def __call__(self, *args, **kwargs):
        if self.calls is not None:
            names = ("topk", "topk2", "num_classes", "alpha", "beta", "eps", "stride")
            settings = {k: getattr(self.inner, k) for k in names if hasattr(self.inner, k)}
            self.calls.append(dict(args=[a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args],
                                   kwargs=kwargs, settings=settings,
                                   autocast=torch.is_autocast_enabled(torch.device(self.device).type)))
        with torch.profiler.record_function("assigner call"):
            if self.mode == "stream" and self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                t0 = time.perf_counter()
                out = self.inner(*args, **kwargs)
                self.host += time.perf_counter() - t0
                end.record()
                self.spans.append((start, end))
                return out
            sync(self.device)  # on the CPU, both modes are the host clock
            if self.cuda:
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            t0 = time.perf_counter()
            out = self.inner(*args, **kwargs)
            sync(self.device)
            self.spans.append(time.perf_counter() - t0)
            if self.cuda:  # the call's own peak: its working memory and its outputs
                self.peak = max(self.peak, torch.cuda.max_memory_allocated() - base)
            return out

    def take(self) -> tuple:
        """Seconds inside the calls since the last take(), and the host seconds of stream mode; call after a
        synchronisation."""
        total = sum(s[0].elapsed_time(s[1]) / 1e3 if isinstance(s, tuple) else s for s in self.spans)
        host, self.spans, self.host = self.host, [], 0.0
        return total, host

    def __getattr__(self, name):
        return getattr(self.inner, name)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--task", choices=("obb", "pose", "seg", "rtdetr"), default="obb")
    p.add_argument("--imgsz", type=int, default=None, help="default 1024 (obb), 640 (pose, seg)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--objects", type=int, nargs="+", default=None, help="objects per image (default 60 300; with "
                   "--dense 2000 5000; pose and seg: 20 100)")
    p.add_argument("--dense", action="store_true", help="a dense scene: small objects (4-60 px) spread uniformly")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--profile", action="store_true", help="profile the assigner calls of two instrumented steps")
    p.add_argument("--trace", metavar="PREFIX", help="with --profile: save the timeline of the profiled steps to "
                   "PREFIX-m<objects>-<peer|patched>.json (Chrome trace format)")
    p.add_argument("--dump", metavar="PREFIX",
                   help="save the assigners' inputs of one patched step to PREFIX-m<objects>.pt")
    args = p.parse_args(argv)
    if args.dense and args.task != "obb":
        p.error("--dense is an OBB scene")
    if args.trace and not args.profile:
        p.error("--trace needs --profile")
    args.objects = args.objects or ([2000, 5000] if args.dense else [20, 100] if args.task in ("pose", "seg") else
                                    [10, 50, 200] if args.task == "rtdetr" else [60, 300])
    args.imgsz = args.imgsz or (640 if args.task in ("pose", "seg", "rtdetr") else 1024)
    model = "rtdetr-l" if args.task == "rtdetr" else "yolo26n-" + args.task
    print(f"{model}, batch {args.batch} at {args.imgsz} px, bf16 autocast, {args.device}, torch {torch.__version__}"
          f"{', ' + torch.cuda.get_device_name() if args.device == 'cuda' else ''}"
          f"{', dense scene (objects of 4-60 px)' if args.dense else ''}")
    print(f"{'objects':>7} {'assigner':<34} {'step ms':>9} {'synchronised ms':>16} {'share':>6} {'stream ms':>10} "
          f"{'share':>6} {'host ms':>8} {'peak MiB':>9} {'assigner MiB':>12}")
    rows = []
    for objects in args.objects:
        for r in measure(args, objects):
            rows.append(r)
            print(f"{objects:>7} {', '.join(r['assigners']):<34} {r['step_s'] * 1e3:9.1f} {r['assign_s'] * 1e3:16.2f} "
                  f"{100 * r['assign_s'] / r['step_s']:5.2f}% {r['stream_s'] * 1e3:10.2f} "
                  f"{100 * r['stream_s'] / r['step_s']:5.2f}% "
                  f"{'-' if r['host_s'] is None else format(r['host_s'] * 1e3, '.2f'):>8} "
                  f"{'-' if r['peak_b'] is None else format(r['peak_b'] / 2**20, '.0f'):>9} "
                  f"{'-' if r['assign_peak_b'] is None else format(r['assign_peak_b'] / 2**20, '.1f'):>12}")
        base, ours = rows[-2], rows[-1]
        # the same figure from the steps in pairs (step i of each: the same batch, run one after the other), which
        # leaves out the machine's drift between steps
        paired = statistics.median(1 - p / u for u, p in zip(base["times"], ours["times"]))
        print(f"{'':>7} step {100 * (1 - ours['step_s'] / base['step_s']):+.1f}% faster with the patch "
              f"(median of the paired steps: {100 * paired:+.1f}%)")
    return rows


if __name__ == "__main__":
    main()
