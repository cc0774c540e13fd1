"""How much search the linear sum assignment does on a DETR trainer's real costs: the steps of SciPy's algorithm (one
column added to the search tree each) for every problem of every matcher call in one training loss of an untrained
transformers RT-DETR (default config, no weights, 80 classes, bf16 autocast, DOTA-like axis-aligned objects), against
uniform random costs of the same shape, and those of the LSAP benchmark's synthetic trainer costs
(``lucid_assign.synthetic.detr_costs``: uniform, untrained, trained) at the same size.

    python bench/lsap_steps.py                                   # batch 4 at 640 px, 200 objects per image (CPU)
    python bench/lsap_steps.py --batch 1 --imgsz 128 --objects 5  # smoke test

The solver runs one problem per block on the GPU, each step of its search after the previous one, so a call of the
op takes about as long as its longest problem's steps; the counts say where the solve's time goes and what matching
several calls' problems at once saves. The steps are counted by the readable reference (lucid_assign.lsap), which
makes SciPy's choices: slow (seconds per call), but it runs anywhere.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_step_transformers as ts  # noqa: E402
from _runs import detr_batch  # noqa: E402
from lucid_assign import lsap  # noqa: E402
from lucid_assign.integrations import transformers as lt  # noqa: E402
from lucid_assign.synthetic import DETR_COSTS, detr_costs  # noqa: E402


def steps(cost: torch.Tensor) -> int:
    """The search steps of SciPy's algorithm on one (R, C) cost: the columns added to the trees of all its searches."""
    count = [0]
    search = lsap._shortest_path

    def counted(*args):
        found = search(*args)
        if found is not None:
            count[0] += int(found[3].sum())  # the columns on the tree
        return found

    lsap._shortest_path = counted
    try:
        lsap.solve_problem(cost)
    finally:
        lsap._shortest_path = search
    return count[0]


def matcher_costs(batch: int, imgsz: int, objects: int, seed: int) -> list:
    """Each matcher call's (cost, object counts) in one loss of the model, in the loss's order."""
    model, _ = ts.build("rt-detr", "cpu")
    images, labels = detr_batch(batch, imgsz, objects, seed, "cpu", 80, "class_labels")
    calls = []
    problems = lt._problems

    def record(cost, where):
        calls.append((cost.double().clone(), list(where.counts)))
        return problems(cost, where)

    lt._problems, from_layers, blocks = record, lt._from_layers, lt._blocks_usable
    lt._from_layers = lambda *args: None  # every call on its own, its matcher's own cost: one recorded cost each
    lt._blocks_usable = lambda *args: (None, None)
    try:
        with lt.patched(), torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            model(pixel_values=images, labels=labels)
    finally:
        lt._problems, lt._from_layers, lt._blocks_usable = problems, from_layers, blocks
    return calls


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--imgsz", type=int, default=640)
    p.add_argument("--objects", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    calls = matcher_costs(args.batch, args.imgsz, args.objects, args.seed)
    g = torch.Generator().manual_seed(args.seed)
    print(f"transformers RT-DETR, batch {args.batch} at {args.imgsz} px, {args.objects} objects per image: "
          f"{len(calls)} matcher calls; search steps per problem (300 queries x the image's objects)")
    for k, (cost, sizes) in enumerate(calls):
        starts = [sum(sizes[:b]) for b in range(len(sizes))]
        counts = [steps(cost[b, :, s:s + n]) for b, (s, n) in enumerate(zip(starts, sizes))]
        uniform = [steps(torch.rand(cost.shape[1], n, generator=g, dtype=torch.float64)) for n in sizes]
        print(f"  call {k + 1}: {min(counts)}-{max(counts)} (median {statistics.median(counts):g}); uniform costs of "
              f"the same shapes {min(uniform)}-{max(uniform)}")
    queries = calls[0][0].shape[1] if calls else 300
    for kind in DETR_COSTS:  # the benchmark's synthetic trainer costs (lucid-assign bench --kind lsap --costs)
        counts = [steps(c.double()) for c in detr_costs(args.batch, queries, args.objects, kind, seed=args.seed)]
        print(f"  synthetic.detr_costs(kind={kind!r}), {queries} x {args.objects}: {min(counts)}-{max(counts)} "
              f"(median {statistics.median(counts):g})")


if __name__ == "__main__":
    main()
