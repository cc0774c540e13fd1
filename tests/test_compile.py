"""torch.compile(fullgraph=True) over the public API as users call it: the drop-in modules and lucid_assign.assign,
on every device the library supports, equal to eager, with the object count changing from call to call.

The kernel path compiles with the default backend (inductor): the op is opaque to it, so the results are the
eager ones bit for bit. The reference path is traced with aot_eager, which runs the traced graph without
rewriting its arithmetic (inductor may fuse the reference's float operations and round its scores differently).
After the first count, the count becomes a dynamic dimension: four counts cost at most two compilations."""

import contextlib

import pytest
import torch

import lucid_assign
from lucid_assign import RotatedTaskAlignedAssigner, TaskAlignedAssigner, ops, reference
from lucid_assign.synthetic import pose_batch, seg_batch

from cases import make_problem, to
from conftest import devices

COUNTS = (12, 15, 20, 9)
# torch 2.4's dynamo traces the reference's nonzero (a data-dependent shape) only with this setting (docs/usage.md);
# later releases without it
NONZERO = torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True)


def _counting(compiles, backend):
    def compile_graph(gm, example_inputs):
        compiles.append(gm)
        if backend == "inductor":
            from torch._inductor.compile_fx import compile_fx

            return compile_fx(gm, example_inputs)
        return torch._dynamo.backends.debugging.aot_eager(gm, example_inputs)

    return compile_graph


def _check(fn, device, obb, backend_of_compile):
    torch._dynamo.reset()
    compiles = []
    compiled = torch.compile(fn, fullgraph=True, backend=_counting(compiles, backend_of_compile))
    for n in COUNTS:
        inputs = to(device, make_problem(n, obb, n_boxes=n, num_classes=7))
        got, want = compiled(*inputs), fn(*inputs)
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and torch.equal(a, b), n
    assert len(compiles) <= 2, f"{len(compiles)} compilations for {len(COUNTS)} object counts"


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("obb", [False, True], ids=["hbb", "obb"])
@pytest.mark.parametrize("backend", ["kernel", "auto"])
def test_compiled_module_equals_eager(library, device, obb, backend):
    cls = RotatedTaskAlignedAssigner if obb else TaskAlignedAssigner
    module = cls(topk=10, num_classes=7, alpha=0.5, beta=6.0, topk2=4 if obb else None, backend=backend)
    _check(module, device, obb, "inductor")


@pytest.mark.parametrize("device", devices())
def test_compiled_functional_equals_eager(library, device):
    def fn(*inputs):
        return lucid_assign.assign(*inputs, topk=7, topk2=1, num_classes=7, alpha=0.5, backend="kernel")

    _check(fn, device, True, "inductor")


@pytest.mark.parametrize("device", devices())
def test_compiled_reference_equals_eager(device):
    with NONZERO:
        _check(TaskAlignedAssigner(topk=10, num_classes=7, backend="reference"), device, False, "aot_eager")


@pytest.mark.parametrize("backend", ["kernel", "reference"])
def test_compiled_label_check_still_fails(library, backend):
    """A label out of range under compile: the CPU op raises a ValueError, the reference path's graph asserts."""
    module = TaskAlignedAssigner(topk=10, num_classes=7, backend=backend)
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    inputs = list(make_problem(3, False, n_boxes=15, num_classes=7))
    with NONZERO:
        compiled(*inputs)
        inputs[3] = inputs[3].clone()
        inputs[3][0, 0, 0] = 9.0
        with pytest.raises(ValueError if backend == "kernel" else RuntimeError, match="gt_labels"):
            compiled(*inputs)


# --- under autocast -------------------------------------------------------------------------------------------------
# The trainer calls the assigner inside torch.autocast, and what autocast changes (CUDA: the power of float16/bfloat16
# scores in float32; CUDA and CPU: the segmentation decode's product in the region's dtype) must reach a compiled
# graph too, which runs outside the region: compiled equals eager in the same region, for every task, score dtype and
# region, on every device.

BOX, POSE, SEG = reference.INPUTS, reference.POSE_INPUTS, reference.SEG_INPUTS
TASKS = ("hbb", "obb", "pose", "seg")
REGIONS = {"off": None, "bf16": torch.bfloat16, "fp16": torch.float16}
SCORES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def _task(task, device, scores, seed=4):
    """(module, positional inputs, keyword inputs) of one task on ``device`` with scores of dtype ``scores`` (and, as
    the trainer passes them under autocast, anchors and the mask inputs in that dtype when it is narrower)."""
    narrow = scores != torch.float32
    kw = dict(topk=10, num_classes=5, alpha=0.5, beta=6.0, backend="kernel")
    if task in ("hbb", "obb"):
        inputs = list(to(device, make_problem(seed, task == "obb", n_boxes=14, num_classes=5, score_dtype=scores)))
        cls = RotatedTaskAlignedAssigner if task == "obb" else TaskAlignedAssigner
        return cls(**kw, topk2=4 if task == "obb" else None), inputs, {}
    if task == "pose":
        b = pose_batch(batch=2, img_size=160, num_classes=5, objects=(10, 10), seed=seed, score_dtype=scores,
                       device=device)
        module = lucid_assign.PoseTaskAlignedAssigner(b["sigmas"], **kw)
        if narrow:
            for k in ("anc_points", "anc_strides", "pd_kpts"):
                b[k] = b[k].to(scores)
        return module, [b[k] for k in BOX + ("anc_strides",)], dict(pd_kpts=b["pd_kpts"], gt_kpts=b["gt_kpts"])
    # a scene whose assignment depends on the decode's dtype (32 prototypes, objects of many sizes)
    b = seg_batch(batch=4, img_size=320, num_classes=5, objects=(30, 40), mask_dim=32, seed=seed + 1,
                  score_dtype=scores, device=device)
    if narrow:
        for k in ("anc_points", "pd_coef", "proto"):
            b[k] = b[k].to(scores)
    return lucid_assign.SegTaskAlignedAssigner(**kw), [b[k] for k in BOX], {k: b[k] for k in SEG}


def _region(device, dtype):
    return torch.autocast(device, dtype=dtype) if dtype is not None else contextlib.nullcontext()


def _supported_region(device, dtype):
    if dtype is not None and not torch.amp.is_autocast_available(device):
        pytest.skip(f"no autocast on {device}")
    if device == "cpu" and dtype == torch.float16:
        try:
            with torch.autocast("cpu", dtype=torch.float16):
                pass
        except (RuntimeError, UserWarning):
            pytest.skip("this torch has no float16 CPU autocast")


def _assert_same(got, want, case):
    for name, a, b in zip(("labels", "boxes", "scores", "fg", "gt_idx"), got, want):
        assert a.dtype == b.dtype and torch.equal(a, b), f"{case}: {name} differs " \
            f"({int((a != b).sum()) if a.shape == b.shape else 'shape'} elements)"


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("scores", list(SCORES), ids=list(SCORES))
@pytest.mark.parametrize("region", list(REGIONS), ids=list(REGIONS))
def test_compiled_equals_eager_under_autocast(library, device, task, scores, region):
    """The module compiled (inductor, fullgraph) and called inside the region equals the eager module in it."""
    _supported_region(device, REGIONS[region])
    module, inputs, extra = _task(task, device, SCORES[scores])
    torch._dynamo.reset()
    compiled = torch.compile(module, fullgraph=True)
    with _region(device, REGIONS[region]):
        got = compiled(*inputs, **extra)
        want = module(*inputs, **extra)
    _assert_same(got, want, f"{task} {scores} scores, autocast {region}")
    # where the region changes the results (amp.h), the scene must show it, or the comparison proves nothing
    pow_in_float32 = device == "cuda" and scores != "f32"
    decode_cast = task == "seg" and scores == "f32"
    if REGIONS[region] is not None and (pow_in_float32 or decode_cast):
        assert not torch.equal(module(*inputs, **extra)[2], want[2]), "the scene does not depend on the region"


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("task", TASKS)
def test_compiled_region_inside_the_graph(library, device, task):
    """A compiled function that enters the region itself (a whole training step compiled) equals eager (scores whose
    results depend on the region: narrow ones for the power on CUDA, float32 ones for the decode's cast)."""
    dtype = torch.bfloat16
    _supported_region(device, dtype)
    module, inputs, extra = _task(task, device, torch.float32 if task == "seg" else dtype)

    def step(*args, **kwargs):
        with torch.autocast(device, dtype=dtype):
            return module(*args, **kwargs)

    torch._dynamo.reset()
    _assert_same(torch.compile(step, fullgraph=True)(*inputs, **extra), step(*inputs, **extra), f"{task} inside")


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("task", TASKS)
def test_the_region_is_an_argument_of_the_op(library, device, task):
    """Outside any region, the op given autocast_dtype computes what it computes inside that region (so a recorded
    call replays the region's results); and inside the region an explicit autocast_dtype is kept."""
    dtype = torch.bfloat16
    _supported_region(device, dtype)
    module, inputs, extra = _task(task, device, dtype)
    op = {"hbb": ops.assign, "obb": ops.assign, "pose": ops.assign_pose, "seg": ops.assign_seg}[task]
    args = list(inputs)
    kw = dict(topk=10, num_classes=5, alpha=0.5, beta=6.0, stride_val=16.0)
    if task == "pose":
        args += [extra["pd_kpts"], extra["gt_kpts"], module.sigmas]
    elif task == "seg":
        args += [extra[k] for k in SEG]
    raw = getattr(torch.ops.lucid, op.__name__)
    positional = [*args, 10, 10, 5, 0.5, 6.0, 1e-9, 16.0] + ([2.0, 12.0] if task == "pose" else [])
    with torch.autocast(device, dtype=dtype):
        inside = op(*args, **kw)
        explicit_inside = op(*args, autocast_dtype=dtype, **kw)
        raw_inside = raw(*positional)  # the op's own autocast kernel fills the region in
    _assert_same(op(*args, autocast_dtype=dtype, **kw), inside, f"{task} outside with autocast_dtype")
    _assert_same(explicit_inside, inside, f"{task} inside with autocast_dtype")
    _assert_same(raw_inside, inside, f"{task} raw op inside")
    _assert_same(raw(*positional, autocast_dtype=dtype), inside, f"{task} raw op outside with autocast_dtype")


@pytest.mark.cuda
@pytest.mark.parametrize("task", ("hbb", "obb", "pose"))
@pytest.mark.parametrize("mode", ["graph", "reduce-overhead"])
def test_cuda_graph_captured_under_autocast(library, task, mode):
    """A CUDA graph captured inside the region (by hand, or by torch.compile's reduce-overhead mode) replays, outside
    it, the eager results of the region for new inputs copied into the captured ones. (The segmentation assignment
    synchronises once and cannot be captured.)"""
    dtype = torch.bfloat16
    module, inputs, extra = _task(task, "cuda", dtype)
    static = [t.clone() for t in inputs]
    static_extra = {k: v.clone() for k, v in extra.items()}
    if mode == "graph":
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.autocast("cuda", dtype=dtype):
            module(*static, **static_extra)  # warm-up outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph), torch.autocast("cuda", dtype=dtype):
            captured = module(*static, **static_extra)
    else:
        torch._dynamo.reset()
        compiled = torch.compile(module, mode="reduce-overhead", fullgraph=True)
    for seed in (5, 6):
        _, new, new_extra = _task(task, "cuda", dtype, seed=seed)
        for t, v in zip(static + list(static_extra.values()), new + list(new_extra.values())):
            t.copy_(v)
        if mode == "graph":
            graph.replay()
            got = [t.clone() for t in captured]
        else:
            with torch.autocast("cuda", dtype=dtype):
                for _ in range(3):  # recorded, then replayed
                    got = [t.clone() for t in compiled(*static, **static_extra)]
        with torch.autocast("cuda", dtype=dtype):
            want = module(*new, **new_extra)
        _assert_same(got, want, f"{task} {mode} seed {seed}")
