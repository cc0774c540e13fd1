"""The linear sum assignment (docs/spec.md, "Linear sum assignment") against its oracle, SciPy's
``scipy.optimize.linear_sum_assignment``: the compiled op on each device and the pure reference, on random, tie-heavy,
forbidden (+inf), ragged, empty, tall and wide problems, exactly (the same pairs, in the same order); its errors; and
the op's CUDA properties (no synchronisation, CUDA graphs, torch.compile, opcheck)."""

import numpy as np
import pytest
import torch

import lucid_assign
from lucid_assign import dispatch, lsap, matching

from conftest import devices

scipy_optimize = pytest.importorskip("scipy.optimize", reason="SciPy is the oracle of the linear sum assignment")
BACKENDS = [pytest.param(("kernel", "cpu"), id="kernel-cpu"), pytest.param(("reference", "cpu"), id="reference"),
            pytest.param(("kernel", "cuda"), id="kernel-cuda", marks=pytest.mark.cuda)]


def scipy_pairs(cost: torch.Tensor):
    """SciPy's (row_ind, col_ind) of one problem, or its ValueError's words."""
    try:
        r, c = scipy_optimize.linear_sum_assignment(cost.double().cpu().numpy())
    except ValueError as exc:
        return str(exc)
    return r.tolist(), c.tolist()


def solve(backend, cost, sizes=None, **options):
    kind, device = backend
    if kind == "kernel":
        pytest.importorskip("lucid_assign._C", reason="compiled library not built")
    sizes_arg = sizes if sizes is None or isinstance(sizes, list) else sizes.to(device)
    return matching.linear_sum_assignment(cost.to(device), sizes_arg, backend=kind, check=False, **options)


def problem(kind: str, rows: int, cols: int, g: torch.Generator) -> torch.Tensor:
    """A cost of one kind: uniform, small integers (exact ties everywhere), constant, with forbidden pairs, negative,
    or rounded to float32 (ties after rounding)."""
    if kind == "uniform":
        return torch.rand(rows, cols, generator=g, dtype=torch.float64)
    if kind == "ties":
        return torch.randint(0, 3, (rows, cols), generator=g).double()
    if kind == "constant":
        return torch.full((rows, cols), 2.5, dtype=torch.float64)
    if kind == "forbidden":
        c = torch.randint(0, 4, (rows, cols), generator=g).double()
        return c.masked_fill(torch.rand(rows, cols, generator=g) < 0.35, float("inf"))
    if kind == "negative":
        return torch.randint(-5, 5, (rows, cols), generator=g).double() * 0.25
    return (torch.rand(rows, cols, generator=g) * 4).round().float()


KINDS = ("uniform", "ties", "constant", "forbidden", "negative", "float32")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", KINDS)
def test_matrices_equal_scipy(backend, kind):
    """2-D costs, tall, wide and square, of every kind: SciPy's pairs in SciPy's order, or SciPy's refusal."""
    g = torch.Generator().manual_seed(KINDS.index(kind))
    for rows, cols in [(0, 0), (0, 4), (3, 0), (1, 1), (1, 7), (7, 1), (5, 5), (4, 9), (9, 4), (13, 13), (6, 17)]:
        for _ in range(3):
            cost = problem(kind, rows, cols, g)
            want = scipy_pairs(cost)
            if isinstance(want, str):  # infeasible: the op says so in info, the API raises SciPy's words
                with pytest.raises(ValueError, match=want):
                    matching.linear_sum_assignment(cost.to(backend[1]), backend=backend[0])
                continue
            r, c = solve(backend, cost)
            assert (r.tolist(), c.tolist()) == want, (kind, rows, cols, cost)
            assert r.device.type == backend[1] and r.dtype == c.dtype == torch.long


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ("uniform", "ties", "forbidden", "float32"))
def test_ragged_batches_equal_scipy_per_problem(backend, kind):
    """A batch with sizes: problem b is cost[b, :, :sizes[b]], its (B, R) columns those of SciPy on it."""
    g = torch.Generator().manual_seed(10 + KINDS.index(kind))
    for rows, cols in [(12, 5), (5, 12), (8, 8)]:
        cost = torch.stack([problem(kind, rows, cols, g) for _ in range(6)])
        sizes = torch.randint(0, cols + 1, (6,), generator=g)
        sizes[0], sizes[1] = 0, cols
        got = solve(backend, cost, sizes)
        assert got.shape == (6, rows)
        for b in range(6):
            want = scipy_pairs(cost[b, :, : sizes[b]])
            expect = [-1] * rows
            if isinstance(want, str):
                assert got[b].tolist() == expect  # unsolved: no pairs (check=False)
                continue
            for r, c in zip(*want):
                expect[r] = c
            assert got[b].tolist() == expect, (kind, b, cost[b, :, : sizes[b]])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", [(4, 300, 10), (4, 300, 50), (2, 300, 200), (2, 120, 300), (2, 200, 200)])
def test_detr_sized_problems_equal_scipy(backend, shape):
    """The sizes of DETR trainers (300 queries against their images' objects) and square ones, float32 costs."""
    if backend[0] == "reference" and shape[2] >= 200:
        pytest.skip("the reference takes seconds here; the kernels are checked against SciPy")
    g = torch.Generator().manual_seed(sum(shape))
    cost = torch.rand(shape, generator=g)
    cost[0] = (cost[0] * 8).round()  # a problem of exact ties
    if backend[0] == "kernel":
        pytest.importorskip("lucid_assign._C", reason="compiled library not built")
        rows, cols, _ = lucid_assign.ops.linear_sum_assignment(cost.to(backend[1]))
    else:
        rows, cols, _ = lsap.linear_sum_assignment(cost)
    for b in range(shape[0]):
        r, c = scipy_pairs(cost[b])
        k = len(r)
        assert rows[b, :k].tolist() == r and cols[b, :k].tolist() == c
        assert (rows[b, k:] == -1).all() and (cols[b, k:] == -1).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ("untrained", "trained"))
def test_trainer_like_costs_equal_scipy(backend, kind):
    """The costs of a DETR trainer (synthetic.detr_costs: an untrained model's near ties, a partly trained one's
    confident and duplicated queries), as the benchmark draws them, at DETR's sizes."""
    from lucid_assign.synthetic import detr_costs

    for shape in [(3, 300, 10), (2, 300, 50), (1, 300, 200), (2, 40, 60)]:
        if backend[0] == "reference" and shape[2] >= 200:
            continue  # seconds here; the kernels are checked against SciPy
        cost = detr_costs(*shape, kind=kind, seed=sum(shape))
        rows, cols, info = (lsap.linear_sum_assignment(cost) if backend[0] == "reference" else
                            _op(backend)(cost.to(backend[1])))
        assert not info.any()
        for b in range(shape[0]):
            r, c = scipy_pairs(cost[b])
            k = len(r)
            assert rows[b, :k].tolist() == r and cols[b, :k].tolist() == c, (kind, shape, b)
            assert (rows[b, k:] == -1).all()


def _op(backend):
    pytest.importorskip("lucid_assign._C", reason="compiled library not built")
    return lucid_assign.ops.linear_sum_assignment


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b.values[0][0] == "kernel"])
def test_seeded_fuzz_equals_scipy(backend):
    """A seeded fuzz of the op against SciPy: batches of every kind of cost (near ties among them, and a DETR
    trainer's), every dtype the op takes, ragged sizes on the cost's device, tall and wide problems of 1 to 700
    columns (on CUDA up to 1,024 rows, so that some problems fill only part of the solver's cache of rows)."""
    from lucid_assign.synthetic import detr_costs

    kind_, device = backend
    g = torch.Generator().manual_seed(2026)
    draw = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=g))  # noqa: E731
    big = 1024 if device == "cuda" else 160
    kinds = ("uniform", "ties", "forbidden", "near", "negative", "untrained")
    dtypes = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
    for n in range(36):
        kind, dtype = kinds[n % len(kinds)], dtypes[n // len(kinds) % len(dtypes)]
        B = draw(1, 3)
        R, C = (draw(1, 12), draw(1, 12)) if n % 3 == 0 else (draw(1, big), draw(1, min(big, 700)))
        if kind == "near":  # ties after rounding, and values a few ulps apart
            cost = (1 + torch.rand(B, R, C, generator=g, dtype=torch.float64) * 1e-6).to(dtype)
        elif kind == "untrained":
            cost = detr_costs(B, max(R, C), min(R, C), kind="untrained", seed=n).to(dtype)
        else:
            cost = torch.stack([problem(kind, R, C, g) for _ in range(B)]).to(dtype)
        R, C = cost.shape[1:]
        sizes = torch.randint(0, C + 1, (B,), generator=g) if n % 2 else None
        rows, cols, info = _op(backend)(cost.to(device), None if sizes is None else sizes.to(device))
        for b in range(B):
            w = C if sizes is None else int(sizes[b])
            want = scipy_pairs(cost[b, :, :w]) if w > 0 else ([], [])
            if isinstance(want, str):
                assert info[b].item() == lsap.INFEASIBLE and (rows[b] == -1).all(), (n, kind, dtype, b)
                continue
            k = len(want[0])
            assert info[b].item() == 0, (n, kind, dtype, b)
            assert (rows[b, :k].tolist(), cols[b, :k].tolist()) == want, (n, kind, dtype, (R, C), w, b)
            assert (rows[b, k:] == -1).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16, torch.float64, torch.float8_e4m3fn))
def test_other_dtypes_are_widened_exactly(backend, dtype):
    """float16 and bfloat16 costs are matched as SciPy matches their exact float64 values; float64 as it is; float8
    (which the op does not take) widened to float64 by the API."""
    g = torch.Generator().manual_seed(3)
    cost = (torch.rand(3, 9, 6, generator=g) * 3).to(dtype)
    got = solve(backend, cost)
    for b in range(3):
        r, c = scipy_pairs(cost[b].double())
        assert [got[b, i].item() for i in r] == c


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", (torch.int64, torch.int32, torch.uint8, torch.bool, torch.float32))
@pytest.mark.parametrize("maximize", (False, True), ids=("min", "max"))
def test_maximize_and_integer_costs_as_scipy(backend, dtype, maximize):
    """SciPy's other inputs: integer and bool costs (read as float64) and ``maximize=True`` (the negated problem),
    tie-heavy, tall and wide, in a batch with ragged sizes; and with maximize, -inf forbids a pair and +inf is
    refused, as SciPy has it."""
    g = torch.Generator().manual_seed(11)
    high = 2 if dtype == torch.bool else 7
    for rows, cols in ((5, 8), (8, 5), (6, 6)):
        cost = torch.randint(0, high, (3, rows, cols), generator=g).to(dtype)
        if dtype == torch.int64:
            cost[0, 0, 0] = 2**62 + 1  # above 2^53: rounded to float64 as NumPy rounds it
        sizes = [cols, cols - 2, 0]
        before = cost.clone()
        got = solve(backend, cost, sizes, maximize=maximize)
        assert torch.equal(cost, before)
        for b in range(3):
            want_r, want_c = scipy_optimize.linear_sum_assignment(cost[b, :, : sizes[b]].numpy(), maximize=maximize)
            assert [got[b, i].item() for i in want_r] == want_c.tolist()
            assert sorted(set(range(rows)) - set(want_r.tolist())) == (got[b] == -1).nonzero().flatten().tolist()
    # with maximize, the infinities change roles: -inf is the forbidden pair, +inf the invalid entry
    kind, device = backend
    lowest = torch.tensor([[1.0, float("-inf")], [float("-inf"), 2.0]], device=device)
    assert [t.tolist() for t in matching.linear_sum_assignment(lowest, maximize=True, backend=kind)] == [[0, 1], [0, 1]]
    assert scipy_optimize.linear_sum_assignment(lowest.cpu().numpy(), maximize=True)[1].tolist() == [0, 1]
    with pytest.raises(ValueError, match="^matrix contains invalid numeric entries$"):
        matching.linear_sum_assignment(lowest.neg(), maximize=True, backend=kind)


@pytest.mark.parametrize("backend", BACKENDS)
def test_errors_have_scipy_words(backend):
    """NaN and -inf are refused, a problem with no complete matching is infeasible: SciPy's ValueError, naming the
    problem in a batch; check=False returns no pairs for it instead."""
    kind, device = backend
    if kind == "kernel":
        pytest.importorskip("lucid_assign._C", reason="compiled library not built")
    nan = torch.tensor([[1.0, float("nan")], [0.0, 2.0]])
    with pytest.raises(ValueError, match="^matrix contains invalid numeric entries$"):
        matching.linear_sum_assignment(nan.to(device), backend=kind)
    neg_inf = torch.tensor([[1.0, float("-inf")], [0.0, 2.0]])
    with pytest.raises(ValueError, match="invalid numeric entries"):
        matching.linear_sum_assignment(neg_inf.to(device), backend=kind)
    blocked = torch.tensor([[float("inf"), float("inf")], [0.0, 2.0]])
    with pytest.raises(ValueError, match="^cost matrix is infeasible$"):
        matching.linear_sum_assignment(blocked.to(device), backend=kind)
    batch = torch.stack([torch.zeros(2, 2), blocked, nan])
    with pytest.raises(ValueError, match=r"^cost\[1\]: cost matrix is infeasible$"):
        matching.linear_sum_assignment(batch.to(device), backend=kind)
    got = matching.linear_sum_assignment(batch.to(device), backend=kind, check=False)
    assert got.tolist() == [[0, 1], [-1, -1], [-1, -1]]
    # a NaN outside a problem's valid columns is not part of it
    assert matching.linear_sum_assignment(nan[None].to(device), [1], backend=kind).tolist() == [[-1, 0]]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", [(2, 2), (6, 40), (40, 6), (300, 10), (3, 1100), (1100, 3)])
@pytest.mark.parametrize("bad", [float("nan"), float("-inf")])
def test_refused_before_infeasible(backend, shape, bad):
    """SciPy checks the whole cost before it solves: a problem whose first search finds no column in reach (its first
    row, in the orientation solved, all +inf) and that holds NaN or -inf only in its last row is refused, not
    infeasible; without the bad entry it is infeasible. Wide and tall problems of every CUDA solver path."""
    rows, cols = shape
    cost = (torch.rand(rows, cols, generator=torch.Generator().manual_seed(rows * cols)) * 4).round()
    first, last = (cost[0], cost[-1]) if rows <= cols else (cost[:, 0], cost[:, -1])
    first.fill_(float("inf"))
    assert scipy_pairs(cost) == "cost matrix is infeasible"
    assert solve(backend, cost[None])[0].tolist() == [-1] * rows
    with pytest.raises(ValueError, match="^cost matrix is infeasible$"):
        matching.linear_sum_assignment(cost.to(backend[1]), backend=backend[0])
    last[len(last) // 2] = bad
    assert scipy_pairs(cost) == "matrix contains invalid numeric entries"
    with pytest.raises(ValueError, match="^matrix contains invalid numeric entries$"):
        matching.linear_sum_assignment(cost.to(backend[1]), backend=backend[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_arguments_name_the_argument(backend):
    kind, device = backend
    if kind == "kernel":
        pytest.importorskip("lucid_assign._C", reason="compiled library not built")
    cost = torch.rand(2, 3, 4, device=device)

    def call(*args, **kw):
        return matching.linear_sum_assignment(*args, backend=kind, **kw)

    with pytest.raises(ValueError, match="cost must be a matrix"):
        call(torch.rand(3, device=device))
    with pytest.raises(ValueError, match="cost must be a matrix"):
        call(torch.rand(1, 2, 3, 4, device=device))
    with pytest.raises(TypeError, match="cost must be float32 or float64"):
        call(torch.ones(3, 3, dtype=torch.complex64, device=device))
    with pytest.raises(TypeError, match="cost must be a torch.Tensor"):
        call([[1.0, 2.0]])
    with pytest.raises(ValueError, match=r"sizes must be \(B,\)"):
        call(cost, [1, 2, 3])
    with pytest.raises(ValueError, match=r"sizes\[1\] must be in \[0, C\] = \[0, 4\], got 5"):
        call(cost, [1, 5])
    with pytest.raises(ValueError, match=r"sizes\[0\] must be in \[0, C\]"):
        call(cost, torch.tensor([-1, 0]))
    with pytest.raises(TypeError, match="sizes must hold integers"):
        call(cost, torch.tensor([1.0, 2.0]))
    for not_integers in ([1.5, 2.0], [True, False], np.array([1.0, 2.0])):  # refused, not truncated
        with pytest.raises(TypeError, match=r"sizes must hold integers .*got sizes\[0\]"):
            call(cost, not_integers)
    with pytest.raises(TypeError, match="sizes must be B integers"):
        call(cost, 3)
    with pytest.raises(TypeError, match="cost must be a dense"):
        call(torch.eye(3).to_sparse())
    with pytest.raises(ValueError, match="sizes applies to a batch"):
        call(cost[0], [1])
    if kind == "kernel":  # the op takes the four float dtypes; the API widens the others
        with pytest.raises(TypeError, match="cost must be float32 or float64"):
            lucid_assign.ops.linear_sum_assignment(cost.to(torch.float8_e4m3fn))


@pytest.mark.parametrize("device", devices())
def test_inputs_are_not_modified(library, device):
    g = torch.Generator().manual_seed(4)
    cost = torch.rand(3, 7, 5, generator=g).to(device)
    cost[0, 1, 2] = float("inf")
    sizes = torch.tensor([5, 2, 0], device=device)
    before = cost.clone(), sizes.clone()
    lucid_assign.ops.linear_sum_assignment(cost, sizes)
    lucid_assign.ops.linear_sum_assignment(cost.transpose(1, 2), sizes.clone().fill_(7))  # tall, non-contiguous
    assert torch.equal(cost, before[0]) and torch.equal(sizes, before[1])


def test_auto_falls_back_to_the_reference_with_a_warning(monkeypatch):
    """Under "auto", a device without a kernel runs the reference, said by a FallbackWarning."""
    monkeypatch.setattr(dispatch, "device_unsupported",
                        lambda device, op="assign": dispatch.Reason("no kernel here (test)", "build it"))
    monkeypatch.setattr(dispatch, "_warned", set())
    monkeypatch.setattr(dispatch, "_unsupported", {})
    cost = torch.rand(4, 3)
    with pytest.warns(lucid_assign.FallbackWarning, match="no kernel here"):
        r, c = matching.linear_sum_assignment(cost)
    assert (r.tolist(), c.tolist()) == scipy_pairs(cost)
    with pytest.raises(RuntimeError, match="backend='kernel' cannot run"):
        matching.linear_sum_assignment(cost, backend="kernel")


def test_op_outputs_and_opcheck(library):
    """The op's outputs (pairs padded with -1, info per problem) and torch.library.opcheck, with sizes on the CPU."""
    g = torch.Generator().manual_seed(5)
    cost = torch.rand(3, 4, 6, generator=g)
    rows, cols, info = library.linear_sum_assignment(cost, torch.tensor([6, 2, 0]))
    assert rows.shape == cols.shape == (3, 4) and info.tolist() == [0, 0, 0] and info.dtype == torch.int32
    assert rows[1].tolist() == [r for r in scipy_pairs(cost[1, :, :2])[0]] + [-1, -1]
    assert rows[2].tolist() == [-1] * 4
    r, c, i = library.linear_sum_assignment(cost[0])
    assert r.shape == (4,) and i.shape == () and (r.tolist(), c.tolist()) == scipy_pairs(cost[0])
    for args in [(cost, None), (cost, torch.tensor([6, 2, 0])), (cost[0], None), (cost.double().transpose(1, 2), None)]:
        torch.library.opcheck(torch.ops.lucid.linear_sum_assignment.default, args)


@pytest.mark.parametrize("device", devices())
def test_columns_form_equals_the_pairs(library, device):
    """linear_sum_assignment.columns (each row's column) against the pairs of the same op turned into rows on the
    host: wide, tall and square batches of every kind, ragged sizes on the CPU and on the device (one out of range
    there), NaN and infeasible problems, matrices; and torch.library.opcheck."""
    g = torch.Generator().manual_seed(12)
    for rows, cols in ((1, 1), (3, 7), (7, 3), (40, 40), (300, 10), (5, 700), (60, 1100), (1100, 4), (0, 3), (3, 0)):
        cost = torch.stack([problem(kind, rows, cols, g).float() for kind in KINDS])
        if rows and cols:
            cost[1, rows // 2, cols // 2] = float("nan")
        sizes = torch.randint(0, cols + 1, (len(KINDS),), generator=g)
        for s in (None, sizes, sizes.to(device)):
            got, info = library.linear_sum_assignment_columns(cost.to(device), s)
            r, c, want_info = library.linear_sum_assignment(cost.to(device), s)
            assert torch.equal(info, want_info) and got.shape == (len(KINDS), rows), (rows, cols)
            want = [[-1] * rows for _ in range(len(KINDS))]
            for b in range(len(KINDS)):
                for i, j in zip(r[b].tolist(), c[b].tolist()):
                    if i >= 0:
                        want[b][i] = j
            assert got.tolist() == want, (rows, cols, s)
        got, info = library.linear_sum_assignment_columns(cost[0].to(device))
        r, c, _ = library.linear_sum_assignment(cost[0].to(device))
        assert got.shape == (rows,) and info.shape == ()
        assert got.tolist() == [dict(zip(r.tolist(), c.tolist())).get(i, -1) for i in range(rows)]
    if device == "cuda":
        bad = torch.tensor([4, 9], device=device)
        got, info = library.linear_sum_assignment_columns(torch.rand(2, 5, 4, device=device), bad)
        assert info.tolist() == [0, lsap.BAD_SIZE] and got[1].tolist() == [-1] * 5
    cost = torch.rand(3, 4, 6, generator=g).to(device)
    for args in [(cost, None), (cost, torch.tensor([6, 2, 0])), (cost[0], None), (cost.double().transpose(1, 2), None)]:
        torch.library.opcheck(torch.ops.lucid.linear_sum_assignment.columns, args)


@pytest.mark.parametrize("device", devices())
def test_the_api_compiles_with_fullgraph(library, device):
    """lucid_assign.linear_sum_assignment with check=False (which reads nothing) under torch.compile(fullgraph=True):
    the eager results, with sizes as a list or a tensor, maximize and an integer cost."""
    g = torch.Generator().manual_seed(7)
    cost = torch.randint(0, 4, (3, 12, 7), generator=g).to(device)
    sizes = torch.tensor([7, 3, 0], device=device)

    def match(c, s):
        return (matching.linear_sum_assignment(c, s, check=False),
                matching.linear_sum_assignment(c, [7, 3, 0], check=False),
                matching.linear_sum_assignment(c.float(), s, maximize=True, check=False))

    compiled = torch.compile(match, fullgraph=True)
    for got, want in zip(compiled(cost, sizes), match(cost, sizes)):
        assert torch.equal(got, want)


@pytest.mark.cuda
def test_cuda_sizes_out_of_range_are_reported_without_a_sync(library):
    """Sizes that live on the GPU are checked by the kernel: info 3 for the problem, and the API raises."""
    cost = torch.rand(2, 5, 4, device="cuda")
    sizes = torch.tensor([4, 9], device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        rows, cols, info = library.linear_sum_assignment(cost, sizes)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert info.tolist() == [0, lsap.BAD_SIZE] and rows[1].tolist() == [-1] * 4
    with pytest.raises(ValueError, match=r"sizes\[1\] is outside \[0, C\]"):
        matching.linear_sum_assignment(cost, sizes)


@pytest.mark.cuda
def test_cuda_no_sync_graphs_and_compile(library):
    """No host synchronisation (sizes on the device or a list), a CUDA graph replays the op (both forms) on new
    costs, and torch.compile(fullgraph=True) gives the eager results."""
    g = torch.Generator().manual_seed(6)
    cost = torch.rand(4, 300, 20, generator=g).cuda()
    sizes = torch.tensor([20, 7, 0, 13], device="cuda")
    eager = library.linear_sum_assignment(cost, sizes)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        library.linear_sum_assignment(cost, sizes)
        matching.linear_sum_assignment(cost, [20, 7, 0, 13], check=False)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    static = cost.clone()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        library.linear_sum_assignment(static, sizes)  # warm-up outside the capture
        library.linear_sum_assignment_columns(static, sizes)
        with torch.cuda.graph(graph):
            out = library.linear_sum_assignment(static, sizes)
            by_row = library.linear_sum_assignment_columns(static, sizes)
    torch.cuda.current_stream().wait_stream(stream)
    fresh = torch.rand(4, 300, 20, generator=g).cuda()
    static.copy_(fresh)
    graph.replay()
    want = library.linear_sum_assignment(fresh, sizes)
    assert all(torch.equal(a, b) for a, b in zip(out, want))
    assert all(torch.equal(a, b) for a, b in zip(by_row, library.linear_sum_assignment_columns(fresh, sizes)))
    compiled = torch.compile(lambda c, s: library.linear_sum_assignment(c, s), fullgraph=True)
    assert all(torch.equal(a, b) for a, b in zip(compiled(cost, sizes), eager))


@pytest.mark.cuda
def test_cuda_large_problems_use_the_global_workspace(library):
    """A problem whose state does not fit in shared memory runs from a workspace in device memory."""
    g = torch.Generator().manual_seed(7)
    cost = (torch.rand(1, 40, 9000, generator=g) * 50).round()
    rows, cols, info = library.linear_sum_assignment(cost.cuda())
    r, c = scipy_pairs(cost[0])
    assert rows[0].tolist() == r and cols[0].tolist() == c and info.item() == 0


@pytest.mark.cuda
def test_sanitize_subset(library):
    """A small run of every path of the CUDA solver and of the DETR cost kernel (used under compute-sanitizer,
    scripts/check_cuda.sh): the register kernels of 1 to 4 columns a thread and 1 to 8 warps, wide and tall problems
    (solved transposed, with and without the transposed copy), both forms of the result (pairs, each row's column),
    ragged sizes on the GPU (one out of range), NaN, an infeasible problem, an empty one, one state in shared memory
    and one in the global workspace, and a problem of more rows than shared memory holds (300 x 1,000 float32); each
    against SciPy."""
    g = torch.Generator().manual_seed(9)
    for rows, cols in ((3, 7), (20, 64), (60, 300), (5, 700), (40, 1024), (300, 1000), (3, 1100), (1100, 3),
                       (2, 8000)):
        cost = (torch.rand(3, rows, cols, generator=g) * 6).round()
        cost[1, 0, 0] = float("nan")
        sizes = torch.tensor([cols, cols, max(cols - 2, 0)])
        if rows <= cols:
            cost[2, :, :] = float("inf")  # infeasible
            cost[2, 0, :] = 1.0  # ... unless a single row
        got = library.linear_sum_assignment(cost.cuda(), sizes.cuda())
        by_row, info = library.linear_sum_assignment_columns(cost.cuda(), sizes.cuda())
        assert torch.equal(info, got[2])
        for b in range(3):
            want = scipy_pairs(cost[b, :, : int(sizes[b])])
            pairs = (got[0][b][got[0][b] >= 0].tolist(), got[1][b][got[1][b] >= 0].tolist())
            assert (pairs if got[2][b] == 0 else lsap.INFO_MESSAGES[int(got[2][b])]) == want, (rows, cols, b)
            matched = by_row[b] >= 0
            assert (matched.nonzero().flatten().tolist(), by_row[b][matched].tolist()) == pairs, (rows, cols, b)
    bad = library.linear_sum_assignment(torch.rand(2, 4, 5, device="cuda"), torch.tensor([5, 6], device="cuda"))
    assert bad[2].tolist() == [0, lsap.BAD_SIZE]
    empty = library.linear_sum_assignment(torch.rand(2, 0, 5, device="cuda"))
    assert empty[0].shape == (2, 0) and empty[2].tolist() == [0, 0]
    groups = torch.tensor([0, 3, 5], device="cuda")
    cost = library.detr_cost(torch.rand(3, 6, 4, device="cuda"), torch.randn(3, 6, 4, device="cuda"),
                             torch.rand(8, 4, device="cuda"), torch.tensor([0, 1, 2, 3, 9, 1, 2, 0], device="cuda"),
                             groups, 5, [2.0, 5.0, 2.0], 0.25, 2.0)
    assert cost.shape == (3, 6, 5) and cost[2, :, 1].isnan().all() and not cost[1, :, :3].isnan().any()


def test_reference_follows_scipy_scan_order():
    """The tie rules in words (docs/spec.md): a constant cost gives the identity (the scan meets the last column
    first, and keeps a later free one at the same cost); a tall one is solved transposed."""
    assert lsap.solve_problem(torch.zeros(3, 5))[1:] == ([0, 1, 2], [0, 1, 2])
    assert lsap.solve_problem(torch.zeros(5, 3))[1:] == ([0, 1, 2], [0, 1, 2])
    assert scipy_pairs(torch.zeros(3, 5)) == ([0, 1, 2], [0, 1, 2])
    rng = np.random.default_rng(8)
    for _ in range(50):
        cost = torch.from_numpy(rng.integers(0, 2, (6, 8)).astype(np.float64))
        info, r, c = lsap.solve_problem(cost)
        assert (r, c) == scipy_pairs(cost)
