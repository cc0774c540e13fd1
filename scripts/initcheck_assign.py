"""Calls of the CUDA assign alone (no reference, no torch.topk), for compute-sanitizer's initcheck, which reports
PyTorch's own torch.topk (called by the reference) and, when filtered to this project's kernels, cannot see the
writes of PyTorch's kernels that produce our inputs. Usage:
    compute-sanitizer --tool initcheck --error-exitcode 9 python3 scripts/initcheck_assign.py
"""

import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]
from cases import make_problem  # noqa: E402
from test_cuda_rows import MIXED, scene  # noqa: E402

from lucid_assign import ops  # noqa: E402

for obb in (False, True):
    for dtype in (torch.float32, torch.bfloat16):
        x = [t.cuda() for t in make_problem(60, obb, batch=2, n_boxes=20, pad_rows=4, score_dtype=dtype)]
        ops.assign(*x, num_classes=7, topk=10, topk2=4, stride_val=16.0)
    ops.assign(*scene(1024, MIXED, obb, seed=1), num_classes=5, topk=10, stride_val=16.0)
    ops.assign(*scene(1280, [[3000, 50, 8]], obb, seed=4), num_classes=5, topk=13, topk2=3, stride_val=16.0)
    ops.assign(*scene(1024, MIXED, obb, seed=5, nan_row=(0, 2), far=True), num_classes=5, topk=10, topk2=3,
               stride_val=16.0)
torch.cuda.synchronize()
print("initcheck_assign: done")
