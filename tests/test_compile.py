"""torch.compile(fullgraph=True) over the public API as users call it: the drop-in modules and lucid_assign.assign,
on every device the library supports, equal to eager, with the object count changing from call to call.

The kernel path compiles with the default backend (inductor): the op is opaque to it, so the results are the
eager ones bit for bit. The reference path is traced with aot_eager, which runs the traced graph without
rewriting its arithmetic (inductor may fuse the reference's float operations and round its scores differently).
After the first count, the count becomes a dynamic dimension: four counts cost at most two compilations."""

import pytest
import torch

import lucid_assign
from lucid_assign import RotatedTaskAlignedAssigner, TaskAlignedAssigner

from cases import make_problem, to
from conftest import devices

COUNTS = (12, 15, 20, 9)


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
    _check(TaskAlignedAssigner(topk=10, num_classes=7, backend="reference"), device, False, "aot_eager")


@pytest.mark.parametrize("backend", ["kernel", "reference"])
def test_compiled_label_check_still_fails(library, backend):
    """A label out of range under compile: the CPU op raises, the reference path's graph asserts."""
    module = TaskAlignedAssigner(topk=10, num_classes=7, backend=backend)
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    inputs = list(make_problem(3, False, n_boxes=15, num_classes=7))
    compiled(*inputs)
    inputs[3] = inputs[3].clone()
    inputs[3][0, 0, 0] = 9.0
    with pytest.raises(RuntimeError, match="gt_labels"):
        compiled(*inputs)
