"""pytest-benchmark suite: ``assign`` and each pass, for every available backend, side by side per case.

    python -m pytest bench                                  # time everything (kept out of the default test run)
    python -m pytest bench -k "obb and b16" --benchmark-columns=median,min,max
    python -m pytest bench --benchmark-disable              # smoke test: every case runs once (CI)

Cases: HBB at 640 px (8,400 anchors, 80 classes) and OBB at 1024 px (21,504 anchors, 15 classes); batch 1 and 16;
10, 50, 200, 1,000 and 2,000 objects per image; and for ``assign`` the pose assignment (HBB at 640 px, 17 keypoints;
20 and 100 people per image) and the segmentation assignment (HBB at 640 px, masks at 160 x 160; 20 and 100 objects
per image); and the linear sum assignment (Hungarian matching) of RT-DETR-sized costs against SciPy's path and
torch-linear-assignment. Backends: the reference, the compiled kernel, and for ``assign`` the
peer (ultralytics) when installed. On CUDA each timed call synchronises; calls rotate over three copies of the
inputs so caches do not flatter; the peak memory of one call is in ``extra_info``. Dense backends are skipped (with
the reason) where their (B, M, A) tensors would not fit: see lucid_assign.bench.DENSE_CPU_LIMIT.
"""

import itertools

import pytest
import torch

from lucid_assign import bench as B

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
CASES = [(kind, batch, objects) for kind in ("hbb", "obb") for batch in (1, 16)
         for objects in (10, 50, 200, 1000, 2000)]
POSE_CASES = [("pose", batch, objects) for batch in (1, 16) for objects in (20, 100)]
SEG_CASES = [("seg", batch, objects) for batch in (1, 16) for objects in (20, 100)]
PASSES = ("points_in_boxes", "pair_overlaps", "box_metrics", "resolve_conflicts")


def _params(backends, extra=(None,), cases=CASES):
    out = []
    for (kind, batch, objects), device, what, backend in itertools.product(cases, DEVICES, extra, backends):
        name = f"{kind}-b{batch}-m{objects}-{device}" + (f"-{what}" if what else "") + f"-{backend}"
        out.append(pytest.param(kind, batch, objects, device, what, backend, id=name))
    return out


def _run(benchmark, fns, device, group):
    benchmark.group = group
    if not getattr(benchmark, "disabled", False):
        benchmark.extra_info["peak_bytes"] = B.peak_memory(fns[0], device)
    cycle = itertools.cycle(fns)

    def call():
        next(cycle)()
        B.sync(device)

    benchmark.pedantic(call, rounds=10 if device == "cuda" else 3, warmup_rounds=1, iterations=1)


@pytest.mark.parametrize("kind, batch, objects, device, what, backend",
                         _params(("reference", "kernel", "peer"), cases=CASES + POSE_CASES + SEG_CASES))
def test_assign(benchmark, kind, batch, objects, device, what, backend):
    copies = B.scene(kind, batch, objects, device, copies=3)
    anchors = copies[0]["anc_points"].shape[0]
    why = (B.kernel_unavailable(device) if backend == "kernel"
           else B.dense_skip(backend, device, batch, objects, anchors))
    runner = B.assign_runner(backend, kind)
    if why is None and isinstance(runner, str):
        why = runner
    if why:
        pytest.skip(why)
    fns = [lambda b=b: runner(b) for b in copies]
    _run(benchmark, fns, device, f"assign {kind} b{batch} m{objects} {device}")


@pytest.mark.parametrize("kind, batch, objects, device, what, backend", _params(("reference", "kernel"), PASSES))
def test_pass(benchmark, kind, batch, objects, device, what, backend):
    from lucid_assign import _library

    copies = B.scene(kind, batch, objects, device, copies=3)
    anchors = copies[0]["anc_points"].shape[0]
    why = B.dense_skip("dense pass", device, batch, objects, anchors)  # every pass here returns (B, M, A) data
    if backend == "kernel" and not _library.has_kernel(what, torch.device(device).type):
        why = f"no compiled {what} kernel for {device}"
    if why:
        pytest.skip(why)
    fns = [B.pass_runner(what, backend, b) for b in copies]
    _run(benchmark, fns, device, f"{what} {kind} b{batch} m{objects} {device}")


LSAP_SHAPES = [(16, 300, 10), (16, 300, 50), (16, 300, 200), (208, 300, 100)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ("kernel", "scipy", "tla"))
@pytest.mark.parametrize("shape", LSAP_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_linear_sum_assignment(benchmark, shape, backend, device):
    """The linear sum assignment of uniform random float32 costs (RT-DETR's 300 queries against its objects): the
    compiled op, the peer matcher's path (to the host, SciPy per problem) and torch-linear-assignment."""
    runner = B.lsap_runner(backend)
    why = B.kernel_unavailable(device) if backend == "kernel" else None
    why = why or (runner if isinstance(runner, str) else None)
    if why:
        pytest.skip(why)
    g = torch.Generator().manual_seed(0)
    copies = [torch.rand(shape, generator=g).to(device) for _ in range(3)]
    fns = [lambda c=c: runner(c) for c in copies]
    _run(benchmark, fns, device, f"linear_sum_assignment {'x'.join(map(str, shape))} {device}")
