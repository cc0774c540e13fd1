"""How the tests compare outputs: the contract of docs/spec.md ("Backends"), in one place.

- Against the peer, and a CUDA kernel against the reference: all five outputs bit for bit (NaN where the other has
  NaN).
- A CPU kernel against the reference: the discrete outputs (labels, boxes, fg_mask, gt_idx) exactly, and the scores
  with the same zeros and NaNs and within a relative ``CPU_SCORE_RTOL`` elsewhere: the one difference docs/spec.md
  allows, from the C library's pow against ATen's vectorised one. Pose adds the OKS sums' own rounding
  (pose_score_rtol).

The peer, on the CPU, runs with torch.topk breaking ties to the lower index (lower_index_topk): CUDA's order and the
contract's rule; the CPU's own order differs.
"""

from __future__ import annotations

import contextlib

import torch
from torch.overrides import TorchFunctionMode

OUTPUTS = ("target_labels", "target_bboxes", "target_scores", "fg_mask", "target_gt_idx")
SCORES = 2
CPU_SCORE_RTOL = 1e-6  # docs/spec.md, "Backends"


def pose_score_rtol(n_kpts: int, dtype: torch.dtype = torch.float32) -> float:
    """The CPU kernel's pose scores against the reference's. Each backend sums the n visible keypoints' positive
    terms in its own order: each sum is within (n - 1) u of the exact one (u the unit roundoff), so the two within
    2(n - 1) u; their exp and the division by the visible count add up to 2 u each: the overlap o within (2n + 2) u.
    A score is align * po / pa with align = s^alpha * o^6: 6 + 1 + 6 = 13 times that, plus CPU_SCORE_RTOL."""
    u = torch.finfo(dtype).eps / 2
    return 13 * (2 * n_kpts + 2) * u + CPU_SCORE_RTOL


def assert_matches(got, want, exact: bool, case: str = "", rtol: float = CPU_SCORE_RTOL) -> None:
    """``got`` as the contract requires of ``want``'s outputs: bit for bit when ``exact`` (a CUDA kernel, the peer),
    else as a CPU kernel (scores within ``rtol``)."""
    assert len(got) == len(want) == len(OUTPUTS), f"{case}: {len(got)} outputs"
    for i, (name, a, b) in enumerate(zip(OUTPUTS, got, want)):
        assert a.dtype == b.dtype and a.shape == b.shape, \
            f"{case} {name}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"
        if a.is_floating_point():
            assert torch.equal(a.isnan(), b.isnan()), f"{case} {name}: NaN pattern differs"
            a, b = a.nan_to_num(0.0), b.nan_to_num(0.0)
        if exact or i != SCORES:
            diff = (a != b).sum().item()
            assert diff == 0, f"{case} {name}: {diff} elements differ"
            continue
        assert torch.equal(a != 0, b != 0), f"{case} {name}: nonzero pattern differs"
        rel = ((a - b).abs() / b.abs().clamp(min=torch.finfo(b.dtype).tiny)).max().item() if b.numel() else 0.0
        assert rel <= rtol, f"{case} {name}: relative difference {rel:.3g} above {rtol:.3g}"


def assert_same(ours, theirs, case: str = "") -> None:
    """Every output bit for bit (NaN where the other has NaN)."""
    assert_matches(ours, theirs, exact=True, case=case)


def _topk_lower_index(input, k, dim=-1, largest=True, sorted=True):
    assert largest, "the assigners only ask for the largest"
    order = torch.sort(input, dim=dim, descending=True, stable=True)
    return torch.return_types.topk((order.values.narrow(dim, 0, k), order.indices.narrow(dim, 0, k)))


class _LowerIndexTopk(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.topk or func is torch.Tensor.topk:
            func = _topk_lower_index
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def lower_index_topk(device):
    """torch.topk and Tensor.topk with ties to the lower index, in this thread, on the CPU (CUDA's order already)."""
    if device != "cpu":
        yield
        return
    with _LowerIndexTopk():
        yield
