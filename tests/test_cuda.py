"""CUDA-only properties of the kernels: agreement with the peer and the CPU kernel, CUDA-graph capture and replay,
torch.compile with reduce-overhead, determinism, and sizes that need 64-bit indices. Skipped without a GPU.

compute-sanitizer over a representative subset (documented in the README):
    compute-sanitizer --tool memcheck python -m pytest tests/test_cuda.py -k "sanitize" -q
    compute-sanitizer --tool racecheck python -m pytest tests/test_cuda.py -k "sanitize" -q
"""

import pytest
import torch

from lucid_assign import api, dispatch, ops, reference

from cases import STRIDES, make_problem, to
from contract import assert_matches

pytestmark = pytest.mark.cuda

DISCRETE = (0, 1, 3, 4)


def _kernel(inputs, **kw):
    return ops.assign(*inputs, stride_val=reference.stride_value(STRIDES), **kw)


@pytest.mark.parametrize("obb", [False, True], ids=["hbb", "obb"])
@pytest.mark.parametrize("setting", [dict(topk=10), dict(topk=13), dict(topk=7, topk2=1)], ids=["k10", "k13", "k7k2"])
@pytest.mark.parametrize("score_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_kernel_equals_peer_on_cuda(library, peer_tal, obb, setting, score_dtype):
    """No topk patch is needed on CUDA: its torch.topk already gives ties to the lower index."""
    inputs = to("cuda", make_problem(30, obb, batch=3, n_boxes=40, pad_rows=6, score_dtype=score_dtype))
    cls = peer_tal.RotatedTaskAlignedAssigner if obb else peer_tal.TaskAlignedAssigner
    theirs = cls(num_classes=7, alpha=0.5, beta=6.0, stride=list(STRIDES), **setting)(*inputs)
    ours = _kernel(inputs, num_classes=7, alpha=0.5, beta=6.0, **setting)
    for a, b in zip(ours, theirs):
        assert a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize("obb", [False, True], ids=["hbb", "obb"])
@pytest.mark.parametrize("score_dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("topk", [dict(topk=10), dict(topk=7, topk2=1)], ids=["k10", "k7k2"])
def test_under_cuda_autocast_equals_peer(library, peer_tal, obb, score_dtype, topk):
    """The peer trainer computes its loss under torch.autocast("cuda"), where pow runs in float32: the kernel, the
    reference and the peer must agree there too (and differ from the same call outside autocast, or the test would
    not see the policy at all)."""
    inputs = to("cuda", make_problem(33, obb, batch=3, n_boxes=40, pad_rows=6, score_dtype=score_dtype))
    kw = dict(num_classes=7, alpha=0.7, beta=6.0, **topk)
    cls = peer_tal.RotatedTaskAlignedAssigner if obb else peer_tal.TaskAlignedAssigner
    with torch.autocast("cuda", dtype=score_dtype):
        theirs = cls(stride=list(STRIDES), **kw)(*inputs)
        ours = _kernel(inputs, **kw)
        api_kernel = api.assign(*inputs, stride=STRIDES, backend="kernel", **kw)
        ref = api.assign(*inputs, stride=STRIDES, backend="reference", **kw)
        metrics = ops.box_metrics(inputs[0], inputs[1], inputs[3], inputs[4],
                                  ops.points_in_boxes(inputs[2], inputs[4], inputs[5], 16.0) & inputs[5].bool(),
                                  alpha=0.7, beta=6.0)
    outside = _kernel(inputs, **kw)
    for result in (ours, api_kernel, ref):
        for a, b in zip(result, theirs):
            assert a.dtype == b.dtype and torch.equal(a, b)
    assert not torch.equal(outside[2], theirs[2])
    cand = ops.points_in_boxes(inputs[2], inputs[4], inputs[5], 16.0) & inputs[5].bool()
    ref_metrics = reference.box_metrics(inputs[0].float(), inputs[1], inputs[3], inputs[4], cand, 0.7, 6.0)
    for a, b in zip(metrics, ref_metrics):
        assert torch.equal(a, b)


@pytest.mark.parametrize("obb", [False, True], ids=["hbb", "obb"])
def test_cuda_and_cpu_kernels_agree(library, obb):
    inputs = make_problem(31, obb, batch=3, n_boxes=40, pad_rows=6)
    kw = dict(num_classes=7, topk=10, topk2=4)
    cpu = _kernel(inputs, **kw)
    gpu = _kernel(to("cuda", inputs), **kw)
    for i in DISCRETE:
        assert torch.equal(cpu[i], gpu[i].cpu())
    # the scores: each as the contract requires of its device's reference (the two references' libraries differ)
    assert_matches(cpu, reference.assign(*inputs, stride=STRIDES, **kw), exact=False)
    assert_matches(gpu, reference.assign(*to("cuda", inputs), stride=STRIDES, **kw), exact=True)


def test_deterministic_across_runs(library):
    inputs = to("cuda", make_problem(32, True, batch=4, n_boxes=60, pad_rows=5))
    first = _kernel(inputs, num_classes=7, topk=10, topk2=3)
    for _ in range(5):
        again = _kernel(inputs, num_classes=7, topk=10, topk2=3)
        assert all(torch.equal(a, b) for a, b in zip(first, again))


@pytest.mark.parametrize("obb", [False, True], ids=["hbb", "obb"])
def test_cuda_graph_capture_and_replay(library, obb):
    """Capture once, then copy new inputs into the captured buffers and replay: equal to eager every time."""
    problems = [to("cuda", make_problem(40 + i, obb, score_dtype=torch.bfloat16)) for i in range(3)]
    static = [t.clone() for t in problems[0]]
    kw = dict(num_classes=7, topk=10, topk2=4)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # warm-up outside the graph
            _kernel(static, **kw)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = _kernel(static, **kw)
    for inputs in problems[1:] + problems[:1]:
        for dst, src in zip(static, inputs):
            dst.copy_(src)
        graph.replay()
        eager = _kernel(inputs, **kw)
        want = reference.assign(*inputs, stride=STRIDES, **kw)
        for a, b, c in zip(captured, eager, want):
            assert torch.equal(a, b) and torch.equal(a, c)


def test_compile_reduce_overhead(library):
    inputs = to("cuda", make_problem(50, True))

    def fn(*args):
        labels, boxes, scores, fg, idx = ops.assign(*args, num_classes=7, topk=10, stride_val=16)
        return scores.sum(-1), fg, idx

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, mode="reduce-overhead")
    eager = fn(*inputs)
    for _ in range(3):
        out = compiled(*inputs)
        assert all(torch.equal(a, b) for a, b in zip(out, eager))


def test_sizes_that_need_64bit_indices(library):
    """B=64 at 1280 px (33,600 anchors) with 1,000 classes: B*A*C = 2.15e9 > 2^31. Two images checked against the
    reference on their own."""
    from lucid_assign.synthetic import anchor_points

    g = torch.Generator(device="cuda").manual_seed(0)
    B, C, M = 64, 1000, 12
    anc = anchor_points(1280, device="cuda")
    A = anc.shape[0]
    assert B * A * C > 2**31
    scores = torch.rand(B, A, C, device="cuda", generator=g)
    ctr = anc[None].expand(B, -1, -1) + (torch.rand(B, A, 2, device="cuda", generator=g) - 0.5) * 16
    wh = 8 + torch.rand(B, A, 2, device="cuda", generator=g) * 120
    pd = torch.cat((ctr - wh / 2, ctr + wh / 2), -1)
    gctr = torch.rand(B, M, 2, device="cuda", generator=g) * 1280
    gwh = 4 + torch.rand(B, M, 2, device="cuda", generator=g) * 300
    gt = torch.cat((gctr - gwh / 2, gctr + gwh / 2), -1)
    labels = (torch.rand(B, M, 1, device="cuda", generator=g) * C).floor()
    labels[-1] = C - 1  # the last classes of the last images: the far end of the score tensor
    mask = torch.ones(B, M, 1, device="cuda")
    out = ops.assign(scores, pd, anc, labels, gt, mask, num_classes=C, topk=10, stride_val=16)
    for sl in (slice(0, 1), slice(B - 1, B)):
        want = reference.assign(scores[sl], pd[sl], anc, labels[sl], gt[sl], mask[sl], num_classes=C, topk=10,
                                stride=STRIDES)
        for a, b in zip(out, want):
            assert torch.equal(a[sl], b)
    assert out[3][-1].any() and (out[2][-1].amax(0)[C - 1] > 0)


@pytest.mark.parametrize("obb", [False, True], ids=["hbb", "obb"])
def test_sanitize_subset(library, obb):
    """A small, representative run of every CUDA kernel (used under compute-sanitizer): all passes, K2 != K, a row
    with more candidates than the shared-memory list holds (the recompute path), and the pass ops."""
    inputs = list(to("cuda", make_problem(60, obb, batch=2, n_boxes=20, pad_rows=4)))
    # a 1024 px image where one object covers more anchors than the shared-memory list holds (4,096)
    scores, pd, anc, labels, gt, mask = make_problem(61, obb, batch=1, n_boxes=6, pad_rows=1, img_size=1024)
    gt[0, 0] = torch.tensor(([512.0, 512.0, 900.0, 900.0, 0.3] if obb else [40.0, 40.0, 1000.0, 1000.0]))
    big_case = to("cuda", (scores, pd, anc, labels, gt, mask))
    # the same big object with every score of its class 0: its top-k is filled with zero-metric anchors, which
    # takes the in-order walk over every anchor
    scores_zero = scores.clone()
    scores_zero[..., int(labels[0, 0, 0])] = 0
    zero_case = to("cuda", (scores_zero, pd, anc, labels, gt, mask))
    for case in (inputs, big_case, zero_case):
        got = _kernel(case, num_classes=7, topk=10, topk2=4)
        want = reference.assign(*case, stride=STRIDES, num_classes=7, topk=10, topk2=4)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    anc, gt, mask = inputs[2], inputs[4], inputs[5]
    cand = reference.points_in_boxes(anc, gt, mask, 16) & mask.bool()
    b, m, a = cand.nonzero(as_tuple=True)
    assert torch.equal(ops.pair_overlaps(gt[b, m], inputs[1][b, a]), reference.pair_overlaps(gt[b, m], inputs[1][b, a]))
    al, ov = ops.box_metrics(inputs[0], inputs[1], inputs[3], gt, cand, 0.5, 6.0)
    al_r, ov_r = reference.box_metrics(inputs[0], inputs[1], inputs[3], gt, cand, 0.5, 6.0)
    assert torch.equal(al, al_r) and torch.equal(ov, ov_r)
    pos = reference.topk_mask(al_r, 10) & cand
    assert torch.equal(ops.resolve_conflicts(pos, ov_r), reference.resolve_conflicts(pos, ov_r))
    assert dispatch.kernel_unsupported(*(inputs[i] for i in (0, 1, 2, 4))) is None
