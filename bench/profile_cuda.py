"""Where the time of the CUDA assign goes: the Python API call, the bare op, a CUDA-graph replay of the op (pure GPU
time, no launch gaps), and the per-kernel GPU time from torch.profiler.

    python bench/profile_cuda.py [--cases obb:16:200 obb:16:2000 hbb:16:100] [--topk2 1]
    python bench/train_step.py --objects 60 300 --dump calls && python bench/profile_cuda.py --inputs calls-m60.pt
    ncu --clock-control none --kernel-name regex:candidate_topk python bench/profile_cuda.py --inputs ... --plain
"""

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from lucid_assign import api, ops, reference  # noqa: E402
from lucid_assign import bench as B  # noqa: E402


def events(fn, reps=30):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        out.append(s.elapsed_time(e) * 1e3)
    return statistics.median(out)


def host(fn, reps=10):
    """Host time per call: calls queued back to back (too few to fill the launch queue), then one synchronisation."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    t = (time.perf_counter() - t0) / reps
    torch.cuda.synchronize()
    return t * 1e6


def synced(fn, reps=30):
    """Wall time of one call between two synchronisations, as bench/train_step.py times the assigner."""
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(out)


def profile(label, x, kw, stride):
    """Time one problem three ways (API call, bare op, graph replay) and list its kernels' GPU time."""
    stride_val = reference.stride_value(stride)
    api_call = lambda: api.assign(*x, backend="kernel", stride=stride, **kw)  # noqa: E731
    op_call = lambda: ops.assign(*x, stride_val=stride_val, **kw)  # noqa: E731
    t_api = events(api_call)
    t_op = events(op_call)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        op_call()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        op_call()
    t_graph = events(g.replay)
    print(f"\n== {label}: api {t_api:.1f} us | op {t_op:.1f} us | graph replay {t_graph:.1f} us | "
          f"api between syncs {synced(api_call):.1f} us | host per call: api {host(api_call):.1f} us, "
          f"op {host(op_call):.1f} us")
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(5):
            api_call()
        torch.cuda.synchronize()
    stats = prof.key_averages()
    print("  GPU time per call:")
    kernels = [r for r in stats if str(r.device_type).endswith("CUDA")]
    for r in sorted(kernels, key=lambda r: -r.device_time_total)[:14]:
        print(f"  {r.device_time_total / 5:9.1f} us  x{r.count // 5:<3} {r.key[:90]}")
    print("  host time per call (self CPU):")
    for r in sorted(stats, key=lambda r: -r.self_cpu_time_total)[:12]:
        print(f"  {r.self_cpu_time_total / 5:9.1f} us  x{r.count // 5:<3} {r.key[:90]}")


def census(x, kw, stride):
    """Rows by path of the CUDA top-k: candidates per real row (<= 64: a warp, <= 4,096: a block, more: big rows)
    and rows with fewer positive metrics than K (their zero-key picks reach outside the candidates)."""
    scores, pd_boxes, anchors, labels, gt_boxes, mask = x
    anchors = anchors.to(gt_boxes.dtype)  # points_in_boxes takes the boxes' dtype
    cand = ops.points_in_boxes(anchors, gt_boxes, mask, reference.stride_value(stride))
    real = mask.reshape(cand.shape[:2]).bool()
    cand &= real[..., None]
    metric, _ = ops.box_metrics(scores.float(), pd_boxes, labels, gt_boxes, cand, kw["alpha"], kw["beta"])
    n = cand.sum(-1)[real]
    npos = ((metric > 0) & cand).sum(-1)[real]
    print(f"  rows {n.numel()}: candidates <= 32: {(n <= 32).sum().item()}, 33-64: "
          f"{((n > 32) & (n <= 64)).sum().item()}, 65-4096: {((n > 64) & (n <= 4096)).sum().item()}, > 4096: "
          f"{(n > 4096).sum().item()}; mean {n.float().mean():.0f}, "
          f"max {n.max().item()}; fewer positive metrics than K: {(npos < kw['topk']).sum().item()}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cases", nargs="+", default=["obb:16:10", "obb:16:200", "obb:16:2000", "hbb:16:100"])
    p.add_argument("--topk2", type=int, default=None)
    p.add_argument("--inputs", nargs="+", default=[],
                   help="files of recorded assigner calls (bench/train_step.py --dump) to profile instead of --cases")
    p.add_argument("--plain", action="store_true",
                   help="only run each recorded call twice through the API (for Nsight Compute), no timing")
    args = p.parse_args()
    if args.inputs:
        for path in args.inputs:
            for i, call in enumerate(torch.load(path)):
                x, st = call["args"], call["settings"]
                kw = dict(topk=st["topk"], topk2=st["topk2"], num_classes=st["num_classes"], alpha=st["alpha"],
                          beta=st["beta"], eps=st["eps"])
                desc = ", ".join(f"{tuple(t.shape)} {str(t.dtype)[6:]}" for t in x)
                amp = call.get("autocast", False)
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
                    if args.plain:
                        for _ in range(2):
                            api.assign(*x, backend="kernel", stride=st["stride"], **kw)
                        torch.cuda.synchronize()
                        continue
                    profile(f"{path} call {i} (topk {kw['topk']}, topk2 {kw['topk2']}, autocast {amp}; {desc})",
                            x, kw, st["stride"])
                if not args.plain:
                    census(x, kw, st["stride"])
        return
    for case in args.cases:
        kind, batch, objects = case.split(":")
        batch, objects = int(batch), int(objects)
        b = B.scene(kind, batch, objects, "cuda")[0]
        x = [b[k] for k in B.INPUTS]
        C = B.KINDS[kind]["num_classes"]
        kw = dict(topk=B.TOPK, topk2=args.topk2, num_classes=C, alpha=0.5, beta=6.0)
        profile(f"{kind} b{batch} m{objects} topk2={args.topk2}", x, kw, (8, 16, 32))
        census(x, kw, (8, 16, 32))


if __name__ == "__main__":
    main()
