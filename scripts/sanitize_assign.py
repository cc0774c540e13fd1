"""Calls of the compiled assign alone (no reference, so no torch.topk), for compute-sanitizer: PyTorch's own torch.topk,
which the reference calls, reads memory it never wrote (initcheck reports it), and the reference's kernels make
racecheck slow. Covers HBB and OBB, fp32 and bf16 scores, K2 != K, rows of every size (a warp, a block, the big-row
kernel, the recompute walk at 1280 px, the sorted medium rows at 1920 px, non-finite boxes, rows about the warp's cap
of 64), bf16 anchors, rows owning more than 32 anchors in the second top-k, 5,000 objects per image, dense scenes
(thousands of small objects, conflicts among thousands of rows, all-zero and NaN overlaps) and every odd input of
docs/odd-inputs.md; the pose assignment (assign_pose): the trainer's dtypes, every keypoint count's tree width, the
gate's edges, rows the gate would starve, 300 people per image and its odd inputs; and the segmentation assignment
(assign_seg): the trainer's dtypes, several decode chunks, 300 objects per image and its odd inputs.

    compute-sanitizer --tool initcheck --error-exitcode 9 python3 scripts/sanitize_assign.py
    compute-sanitizer --tool racecheck --error-exitcode 9 python3 scripts/sanitize_assign.py
    python3 scripts/sanitize_assign.py --device cpu     # the same calls on the CPU kernel (a dry run)
"""

import argparse
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]
from cases import make_problem  # noqa: E402
from test_cuda_rows import MIXED, NEAR_WARP_CAP, scene  # noqa: E402
from test_dense_scenes import crowd  # noqa: E402
from test_hardening import _cases  # noqa: E402
from test_pose import ODD, gate_edge_problem, odd, problem, starved_problem  # noqa: E402
import test_seg  # noqa: E402

from lucid_assign import ops, reference  # noqa: E402
from lucid_assign.synthetic import dense_batch  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    p.add_argument("--no-odd", action="store_true", help="skip the odd-input cases")
    args = p.parse_args()
    dev = args.device
    calls = 0

    def run(x, **kw):
        nonlocal calls
        ops.assign(*[t.to(dev) for t in x], stride_val=16.0, **kw)
        calls += 1

    for obb in (False, True):
        for dtype in (torch.float32, torch.bfloat16):
            run(make_problem(60, obb, batch=2, n_boxes=20, pad_rows=4, score_dtype=dtype), num_classes=7, topk=10,
                topk2=4)
        run(scene(1024, MIXED, obb, seed=1, device="cpu"), num_classes=5, topk=10)
        run(scene(1280, [[3000, 50, 8]], obb, seed=4, device="cpu"), num_classes=5, topk=13, topk2=3)
        # 1920 px: more anchors than the block's bitmap holds, so medium rows sort their candidates
        run(scene(1920, [[90, 160, 260, 20, 6], [330, 120]], obb, seed=8, device="cpu"), num_classes=5, topk=10)
        run(scene(1024, MIXED, obb, seed=5, nan_row=(0, 2), far=True, device="cpu"), num_classes=5, topk=10, topk2=3)
        run(scene(1024, MIXED, obb, seed=7, device="cpu"), num_classes=5, topk=40, topk2=3)  # rows owning > 32
        near_cap = scene(1024, NEAR_WARP_CAP, obb, seed=3, device="cpu")  # rows of about 64 candidates
        run(near_cap, num_classes=5, topk=10)
        run(near_cap, num_classes=5, topk=300, topk2=3)  # K beyond the candidates
        dense = dense_batch(batch=2, objects=(2500, 5000), obb=obb, seed=3)
        run([dense[k] for k in reference.INPUTS],
            num_classes=60, topk=10)
        for far, nan in ((False, 0.0), (True, 0.0), (False, 0.05)):  # conflicts among 3,000 rows
            run(crowd(3000, obb=obb, seed=5, far=far, nan_preds=nan), num_classes=5, topk=10, topk2=None if nan else 3)
        bf16_anchors = list(near_cap)
        bf16_anchors[2] = (bf16_anchors[2] + 0.3).bfloat16()  # widened by the kernel
        run(bf16_anchors, num_classes=5, topk=10, topk2=3)
        if not args.no_odd:
            for inputs in _cases(obb).values():
                if inputs[4].dtype != torch.float32 and dev == "cuda":
                    continue  # float64: the CUDA kernel takes float32 boxes (the API runs the reference)
                for k2 in (10, 3):
                    run(inputs, num_classes=7, topk=10, topk2=k2, alpha=1.0)
    def run_pose(x, **kw):
        nonlocal calls
        ops.assign_pose(*[t.to(dev) for t in x], stride_val=16.0, **kw)
        calls += 1

    for trainer_dtypes in (False, True):
        run_pose(problem(1, trainer_dtypes=trainer_dtypes), num_classes=3, topk=10)
        run_pose(problem(2, trainer_dtypes=trainer_dtypes), num_classes=3, topk=7, topk2=1)
    for keypoints in (1, 3, 5, 16, 33, 63):
        run_pose(problem(keypoints, keypoints=keypoints), num_classes=3, topk=10, topk2=4)
    run_pose(gate_edge_problem("cpu"), num_classes=3, topk=10)
    run_pose(starved_problem("cpu"), num_classes=3, topk=10, topk2=3)
    run_pose(problem(12, batch=2, img_size=640, objects=(250, 300), num_classes=1), num_classes=1, topk=10, topk2=3)
    if not args.no_odd:
        for case in ODD:
            run_pose(odd(case, "cpu"), num_classes=3, topk=10, topk2=3)
    def run_seg(x, **kw):
        nonlocal calls
        ops.assign_seg(*[t.to(dev) for t in x], stride_val=16.0, **kw)
        calls += 1

    for trainer_dtypes in (False, True):
        run_seg(test_seg.problem(1, trainer_dtypes=trainer_dtypes), num_classes=3, topk=10)
        run_seg(test_seg.problem(2, trainer_dtypes=trainer_dtypes), num_classes=3, topk=7, topk2=1)
    run_seg(test_seg.problem(14, batch=3, img_size=640, objects=(80, 100)), num_classes=3, topk=40)
    run_seg(test_seg.problem(13, batch=2, img_size=640, objects=(250, 300), num_classes=5, mask_dim=16), num_classes=5,
            topk=10, topk2=3)
    if not args.no_odd:
        for case in test_seg.ODD:
            if case != "float64" or dev == "cpu":
                run_seg(test_seg.odd(case, "cpu"), num_classes=3, topk=10, topk2=3)
    # 5,000 objects per image, with and without a second top-k (tests/test_hardening.py)
    many = make_problem(7, True, batch=1, n_boxes=5000, pad_rows=100, img_size=64)
    run(many, num_classes=7, topk=10)
    run(many, num_classes=7, topk=10, topk2=3)
    if dev == "cuda":
        torch.cuda.synchronize()
    print(f"sanitize_assign: {calls} calls on {dev}: done")


if __name__ == "__main__":
    main()
