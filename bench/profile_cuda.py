"""Where the time of the CUDA assign goes: the Python API call, the bare op, a CUDA-graph replay of the op (pure GPU
time, no launch gaps), and the per-kernel GPU time from torch.profiler.

    python bench/profile_cuda.py [--cases obb:16:200 obb:16:2000 hbb:16:100]
"""

import argparse
import statistics
import sys

import torch

sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.dirname(__import__("os").path.abspath(__file__))))
from lucid_assign import api, ops  # noqa: E402
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


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cases", nargs="+", default=["obb:16:10", "obb:16:200", "obb:16:2000", "hbb:16:100"])
    p.add_argument("--topk2", type=int, default=None)
    args = p.parse_args()
    for case in args.cases:
        kind, batch, objects = case.split(":")
        batch, objects = int(batch), int(objects)
        b = B.scene(kind, batch, objects, "cuda")[0]
        x = [b[k] for k in B.INPUTS]
        C = B.KINDS[kind]["num_classes"]
        kw = dict(topk=B.TOPK, topk2=args.topk2, num_classes=C, alpha=0.5, beta=6.0)
        t_api = events(lambda: api.assign(*x, backend="kernel", stride=(8, 16, 32), **kw))
        t_op = events(lambda: ops.assign(*x, stride_val=16.0, **kw))
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            ops.assign(*x, stride_val=16.0, **kw)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            ops.assign(*x, stride_val=16.0, **kw)
        t_graph = events(g.replay)
        print(f"\n== {kind} b{batch} m{objects} topk2={args.topk2}: api {t_api:.1f} us | op {t_op:.1f} us | "
              f"graph replay {t_graph:.1f} us")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                ops.assign(*x, stride_val=16.0, **kw)
            torch.cuda.synchronize()
        rows = sorted(prof.key_averages(), key=lambda r: -r.device_time_total)[:12]
        for r in rows:
            print(f"  {r.device_time_total / 5:9.1f} us/call  x{r.count // 5:<3} {r.key[:90]}")


if __name__ == "__main__":
    main()
