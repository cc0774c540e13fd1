"""The linear sum assignment (Hungarian matching) of the public API: SciPy's ``linear_sum_assignment`` on each problem,
its choice exactly, on the device of the cost, through the one dispatch (lucid_assign.dispatch). The compiled op is
``torch.ops.lucid.linear_sum_assignment`` (csrc/lsap.h); the reference, lucid_assign.lsap."""

from __future__ import annotations

import torch

from . import checks, dispatch, lsap, ops


def run(chosen: str, cost: torch.Tensor, sizes: torch.Tensor | None):
    """The op's outputs ``(row_ind, col_ind, info)`` for a batch of costs from a backend already chosen by
    dispatch.choice: the op ("kernel"), or the reference after checking the inputs ("reference")."""
    if chosen == "kernel":
        return ops.linear_sum_assignment(cost, sizes)
    checks.check_lsap_inputs(cost, sizes)
    return lsap.linear_sum_assignment(cost, sizes)


def raise_unsolved(info: torch.Tensor | list, name=None, order=None) -> None:
    """ValueError with SciPy's words for the first problem the op did not solve (``info``, its third output, or its
    values already read to the host as a list), as ``name(b)`` names problem b (default ``cost[b]``; none for one
    matrix); ``order``: the problems in the order in which to look (default: as they are). It reads a tensor
    ``info``: on CUDA, one synchronisation."""
    single = isinstance(info, torch.Tensor) and info.dim() == 0
    codes = info if isinstance(info, list) else info.reshape(-1).tolist()
    for b in range(len(codes)) if order is None else order:
        if codes[b]:
            message = lsap.INFO_MESSAGES[codes[b]].format(b=b)
            if single or codes[b] == lsap.BAD_SIZE:
                raise ValueError(message)
            raise ValueError(f"{name(b) if name else f'cost[{b}]'}: {message}")


def linear_sum_assignment(cost: torch.Tensor, sizes=None, *, maximize: bool = False, backend: str = "auto",
                          check: bool = True):
    """The linear sum assignment (Hungarian matching): ``scipy.optimize.linear_sum_assignment`` on each problem, its
    choice exactly, ties included (docs/spec.md, "Linear sum assignment"), on the device of ``cost``.

    Args:
        cost: (R, C) or a batch (B, R, C) of costs, float32 or float64 (float16 and bfloat16 are widened exactly;
            integer, bool and float8 costs are read as float64, as SciPy reads them); +inf forbids a pair, NaN and -inf
            are refused.
        sizes: for a batch, the valid columns of each problem (problem b is ``cost[b, :, :sizes[b]]``, e.g. each
            image's objects): B integers, a list or a tensor on the CPU or on the device of ``cost``; None: all C.
        maximize: match for the largest total, as SciPy's ``maximize=True``: the problem of the negated cost (so
            -inf forbids a pair and +inf is refused).
        backend: "auto" (the compiled op where it has a kernel for the device, else the reference with a
            FallbackWarning), "kernel" or "reference", as for ``assign``.
        check: raise ValueError with SciPy's words when a problem holds NaN or -inf or has no complete matching that
            avoids +inf (on CUDA this reads the op's status: one synchronisation). False: never synchronise; the
            rows of such a problem are all -1 (``torch.ops.lucid.linear_sum_assignment`` also returns the status).

    Returns:
        For a matrix: ``(row_ind, col_ind)``, int64 tensors of min(R, C) pairs, as SciPy returns them (rows
        ascending). For a batch: (B, R) int64, the column matched to each row of each problem, -1 for none.
    """
    checks.require_tensors(("cost",), (cost,))
    if cost.dtype not in checks.FLOAT_DTYPES and not cost.is_complex():
        # SciPy's reading of integer and bool costs (int64 rounds as NumPy rounds it); float8 widens exactly
        try:
            cost = cost.to(torch.float64)
        except RuntimeError:  # a dtype torch cannot widen (packed float4)
            raise TypeError(f"cost must be real numbers (float32 or float64; other real dtypes are widened to "
                            f"float64), got {cost.dtype}") from None
    if maximize:
        cost = -cost  # exact in every float dtype; a new tensor, the caller's is left as it is
    if sizes is not None and not isinstance(sizes, torch.Tensor):
        sizes = checks.sizes_tensor(sizes)  # on the CPU: checked at the call, no synchronisation
    chosen = dispatch.choice(backend, ("linear_sum_assignment", cost.device.type))
    if chosen == "kernel" and cost.dim() == 3:
        out, info = ops.linear_sum_assignment_columns(cost, sizes)  # the op writes each row's column itself
    else:
        rows, cols, info = run(chosen, cost, sizes)
        if cost.dim() == 2:
            n = min(cost.shape)
            out = rows[:n], cols[:n]
        else:
            out = pairs_to_columns(rows, cols, cost.shape[1])  # launched before the status is read, not after
    if check:
        raise_unsolved(info)
    return out


def pairs_to_columns(rows: torch.Tensor, cols: torch.Tensor, n_rows: int) -> torch.Tensor:
    """(B, K) pairs in SciPy's form (-1 after the last) to the (B, R) column of each row (-1 for none), on the device,
    without synchronising."""
    out = rows.new_full((rows.shape[0], n_rows + 1), -1)
    return out.scatter_(1, rows.remainder(n_rows + 1), cols)[:, :n_rows]  # -1 (no pair) to the spare column n_rows
