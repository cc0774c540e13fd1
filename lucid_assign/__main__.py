"""Command line: ``python -m lucid_assign demo`` assigns a built-in DOTA-like batch and says what happened."""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from . import _library, api, reference
from .synthetic import dota_like_batch

INPUTS = ("pd_scores", "pd_bboxes", "anc_points", "gt_labels", "gt_bboxes", "mask_gt")


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _time(fn, device, reps):
    fn()  # warm-up
    _sync(device)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times)


def _describe(out, batch, strides, img_size):
    labels, boxes, scores, fg, idx = out
    mask = batch["mask_gt"][..., 0].bool()
    n_boxes = mask.shape[1]
    counts = torch.zeros_like(mask, dtype=torch.long)
    if n_boxes:
        counts.scatter_add_(1, idx * fg, fg.long())
    per_obj = counts[mask].tolist()
    print(f"  positives per object: mean {statistics.mean(per_obj):.2f}, median {statistics.median(per_obj):g}, "
          f"min {min(per_obj)}, max {max(per_obj)}")
    none = sum(1 for c in per_obj if c == 0)
    print(f"  objects left with no positive: {none} of {len(per_obj)} ({100.0 * none / len(per_obj):.1f}%)")
    start = 0
    parts = []
    for s in strides:
        n = (img_size // s) ** 2
        parts.append(f"P{s}: {int(fg[:, start:start + n].sum())}")
        start += n
    print(f"  foreground anchors: {int(fg.sum())} of {fg.numel()} ({', '.join(parts)})")
    print(f"  target score sum: {float(scores.sum()):.3f}")


def demo(args) -> int:
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    if args.device != "auto":
        devices = [args.device]
    lo, hi = args.objects
    print(f"lucid-assign demo: DOTA-like {'OBB' if not args.hbb else 'HBB'} batch of {args.batch} at "
          f"{args.img_size} px, {args.classes} classes, {lo}-{hi} objects per image, topk {args.topk}")
    print(f"torch {torch.__version__}; compiled library: "
          f"{'loaded' if _library.loaded() else 'not loaded (' + str(_library.LOAD_ERROR) + ')'}")
    host = dota_like_batch(batch=args.batch, img_size=args.img_size, num_classes=args.classes, objects=(lo, hi),
                           obb=not args.hbb, seed=args.seed)
    strides = host["stride"]
    print(f"anchors: {host['anc_points'].shape[0]}, objects per image: {host['num_objects']}")
    kw = dict(topk=args.topk, num_classes=args.classes, stride=strides)
    stride_val = reference.stride_value(strides)
    first = None
    for device in devices:
        batch = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in host.items()}
        inputs = [batch[k] for k in INPUTS]
        kernel = api.kernel_unsupported(*(batch[k] for k in ("pd_scores", "pd_bboxes", "anc_points", "gt_bboxes")))
        results = {}
        print(f"\n[{device}]")
        for backend in ("reference", "kernel"):
            if backend == "kernel" and kernel is not None:
                print(f"  kernel: not available ({kernel})")
                continue
            out = api.assign(*inputs, backend=backend, **kw)
            med, best = _time(lambda: api.assign(*inputs, backend=backend, **kw), device, args.reps)
            results[backend] = (out, med)
            print(f"  {backend:<9} assign: median {med * 1e3:8.2f} ms, min {best * 1e3:8.2f} ms")
        out = results.get("kernel", results["reference"])[0]
        _describe(out, batch, strides, args.img_size)
        if "kernel" in results:
            ref_out, ref_med = results["reference"]
            same = all(torch.equal(out[i], ref_out[i]) for i in (0, 1, 3, 4))
            scale = ref_out[2].abs().clamp(min=torch.finfo(ref_out[2].dtype).tiny)
            rel = float(((out[2] - ref_out[2]).abs() / scale).max()) if out[2].numel() else 0.0
            print(f"  kernel vs reference: {ref_med / results['kernel'][1]:.1f}x faster; labels/boxes/fg/index "
                  f"identical: {same}; scores max relative difference {rel:.1e}")
        if first is None:
            first = out
        else:
            # CPU and GPU math libraries round some transcendental results differently (SPEC.md, precision
            # contract), so scores may differ in the last bits and a near-tie may fall the other way.
            same = [torch.equal(out[i].cpu(), first[i].cpu()) for i in (0, 1, 3, 4)]
            a, b = out[2].cpu().double(), first[2].cpu().double()
            rel = float(((a - b).abs() / b.abs().clamp(min=1e-30)).max()) if b.numel() else 0.0
            moved = int((out[3].cpu() != first[3]).sum())
            print(f"  vs {devices[0]}: labels/boxes/fg/index identical: {all(same)} ({moved} fg anchors differ); "
                  f"scores max relative difference {rel:.1e}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lucid_assign", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="assign a built-in DOTA-like batch and report what happened")
    d.add_argument("--batch", type=int, default=4)
    d.add_argument("--img-size", type=int, default=1024)
    d.add_argument("--classes", type=int, default=15)
    d.add_argument("--objects", type=int, nargs=2, default=(20, 300), metavar=("LOW", "HIGH"))
    d.add_argument("--topk", type=int, default=10)
    d.add_argument("--hbb", action="store_true", help="axis-aligned boxes instead of oriented ones")
    d.add_argument("--device", default="auto", help="cpu, cuda or auto (both when a GPU is present)")
    d.add_argument("--reps", type=int, default=3)
    d.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.command == "demo":
        return demo(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
