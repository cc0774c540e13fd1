"""pytest-benchmark timings of the containment pass: reference vs torch.ops.lucid.points_in_boxes.

    python -m pytest bench --benchmark-group-by=param:case          (kept out of the default test run)
"""

import pytest
import torch

from lucid_assign import _library, ops, reference
from lucid_assign.synthetic import dota_like_batch

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
CASES = {"obb-1024-b4-200": dict(batch=4, objects=200, obb=True), "hbb-640-b4-100": dict(batch=4, objects=100,
                                                                                       obb=False, img_size=640)}


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["reference", "kernel"])
@pytest.mark.parametrize("case", list(CASES))
def test_points_in_boxes(benchmark, case, backend, device):
    if backend == "kernel" and not _library.has_kernel("points_in_boxes", device):
        pytest.skip("no compiled kernel for this device")
    b = dota_like_batch(device=device, **CASES[case])
    fn = ops.points_in_boxes if backend == "kernel" else reference.points_in_boxes
    args = (b["anc_points"], b["gt_bboxes"], b["mask_gt"], reference.stride_value(b["stride"]))

    def run():
        fn(*args)
        _sync(device)

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    benchmark.pedantic(run, rounds=5, warmup_rounds=1)
    if device == "cuda":
        benchmark.extra_info["peak_bytes_beyond_inputs"] = torch.cuda.max_memory_allocated() - base
