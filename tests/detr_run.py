"""A training script's stand-in, run by tests/test_detr_matchers.py under ``lucid-assign run --matcher
detr_matchers:...``: it imports the matchers (which the run patches at that import), runs each named one on a few
batches, counting the op's solves and SciPy's, then unpatches and runs them again (SciPy's own), and prints one JSON
line per process: whether it was patched, the counts, and whether every call's result was the same.

    python tests/detr_run.py softmax one-to-many            # in this process
    python tests/detr_run.py --spawn softmax                 # in a worker started by multiprocessing's spawn
    python -m torch.distributed.run --nproc_per_node 2 tests/detr_run.py softmax   # each rank (gloo)
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

CASES = ([3, 0, 5, 1], [20, 2], [0, 0], [4])


def report(names: list) -> dict:
    import detr_matchers as dm  # patched by lucid-assign run when it is imported

    import torch
    from lucid_assign.integrations import detr

    rank = int(os.environ.get("RANK", 0))
    patched = {name: detr.is_patched(dm.MATCHERS[name]) for name in names}
    calls = [(dm.MATCHERS[name](), dm.batch(counts_, seed=k + 10 * rank))
             for name in names for k, counts_ in enumerate(CASES)]
    with dm.counting() as solved:
        ours = [m(*b) for m, b in calls]
    detr.unpatch()
    theirs = [m(*b) for m, b in calls]

    def same(a, b):
        if isinstance(a, torch.Tensor):
            return a.dtype == b.dtype and torch.equal(a, b)
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))

    return dict(rank=rank, pid=os.getpid(), patched=patched, op_calls=solved["op"], scipy_calls=solved["scipy"],
                same=all(same(a, b) for a, b in zip(ours, theirs)), calls=len(calls))


def main() -> None:
    args = sys.argv[1:]
    spawn = args[:1] == ["--spawn"]
    names = args[1:] if spawn else args
    if "RANK" in os.environ:
        import torch.distributed as dist

        dist.init_process_group("gloo")
    if spawn:
        import multiprocessing

        with multiprocessing.get_context("spawn").Pool(1) as pool:
            found = pool.apply(report, (names,))
        found["parent_pid"] = os.getpid()
    else:
        found = report(names)
    # one write of the whole line: ranks share the pipe, and print's separate write of the newline (unbuffered
    # output) can put another rank's line between them
    sys.stdout.write(json.dumps(found) + "\n")
    sys.stdout.flush()
    if "RANK" in os.environ:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
