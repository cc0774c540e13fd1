"""The linear sum assignment in pure PyTorch: docs/spec.md ("Linear sum assignment") in executable form.

The solver is the shortest augmenting path of Crouse (2016) as SciPy's ``scipy.optimize.linear_sum_assignment`` runs
it, with SciPy's order of rows, order of the column scan and tie rules, in float64. It is meant to be read, not to be
fast: one problem at a time, one vectorised scan per step of the search. The compiled op
``torch.ops.lucid.linear_sum_assignment`` (csrc/lsap.h, csrc/cpu/ and csrc/cuda/) makes the same choices.
"""

from __future__ import annotations

import torch

# What a problem came to: the op's ``info`` output (csrc/lsap.h).
SOLVED, INVALID_ENTRY, INFEASIBLE, BAD_SIZE = 0, 1, 2, 3
INFO_MESSAGES = {
    INVALID_ENTRY: "matrix contains invalid numeric entries",  # SciPy's words for NaN or -inf
    INFEASIBLE: "cost matrix is infeasible",  # SciPy's words when no complete matching avoids +inf
    BAD_SIZE: "sizes[{b}] is outside [0, C]",
}


def _shortest_path(cost, u, v, row4col, cur):
    """The search of one augmenting path from row ``cur``: Dijkstra over the reduced costs until it reaches a free
    column (the sink). Returns (sink, its distance, the rows and columns on the tree, the distances, the path), or
    None when every column left is at an infinite distance (infeasible)."""
    nr, nc = cost.shape
    inf = float("inf")
    remaining = list(range(nc - 1, -1, -1))  # SciPy scans the last column first, and removes by swapping in the last
    spc = torch.full((nc,), inf, dtype=torch.float64)
    path = torch.full((nc,), -1, dtype=torch.long)
    rows_on_tree = torch.zeros(nr, dtype=torch.bool)
    cols_on_tree = torch.zeros(nc, dtype=torch.bool)
    min_val = 0.0
    i = cur
    while True:
        rows_on_tree[i] = True
        cols = torch.tensor(remaining, dtype=torch.long)
        # the path's length so far plus the cost, less the duals, added left to right as SciPy adds them
        r = ((min_val + cost[i, cols]) - u[i]) - v[cols]
        shorter = r < spc[cols]
        path[cols[shorter]] = i
        spc[cols] = torch.where(shorter, r, spc[cols])
        # SciPy's scan takes a column below the lowest so far, or equal to it and free: so among the columns at the
        # least distance, the last free one in the scan order, else the first one
        dist = spc[cols]
        lowest = float(dist.min())
        if lowest == inf:
            return None
        at_lowest = (dist == lowest).nonzero().flatten()
        free = at_lowest[row4col[cols[at_lowest]] == -1]
        index = int(free[-1]) if len(free) else int(at_lowest[0])
        min_val = lowest
        j = remaining[index]
        cols_on_tree[j] = True
        remaining[index] = remaining[-1]
        remaining.pop()
        if row4col[j] == -1:
            return j, min_val, rows_on_tree, cols_on_tree, spc, path
        i = int(row4col[j])


def solve(cost: torch.Tensor) -> tuple[int, list[int]]:
    """One problem of nr <= nc rows, float64 on the CPU: (info, the column of each row)."""
    nr, nc = cost.shape
    u = torch.zeros(nr, dtype=torch.float64)
    v = torch.zeros(nc, dtype=torch.float64)
    col4row = torch.full((nr,), -1, dtype=torch.long)
    row4col = torch.full((nc,), -1, dtype=torch.long)
    for cur in range(nr):
        found = _shortest_path(cost, u, v, row4col, cur)
        if found is None:
            return INFEASIBLE, []
        sink, min_val, rows_on_tree, cols_on_tree, spc, path = found
        # the duals: the rows and columns on the tree move by how much shorter than the sink they were reached
        u[cur] += min_val
        others = rows_on_tree.clone()
        others[cur] = False
        u[others] += min_val - spc[col4row[others]]
        v[cols_on_tree] -= min_val - spc[cols_on_tree]
        # flip the matching along the path from the sink back to row cur
        j = sink
        while True:
            i = int(path[j])
            row4col[j] = i
            col4row[i], j = j, int(col4row[i])
            if i == cur:
                break
    return SOLVED, col4row.tolist()


def solve_problem(cost: torch.Tensor) -> tuple[int, list[int], list[int]]:
    """SciPy's linear_sum_assignment of one (R, C) cost: (info, row_ind, col_ind). A tall cost is solved transposed
    (its columns as the solver's rows) and read back in ascending order of its rows."""
    cost = cost.detach().to("cpu", torch.float64)
    rows, cols = cost.shape
    if rows == 0 or cols == 0:
        return SOLVED, [], []
    if bool((cost.isnan() | (cost == float("-inf"))).any()):
        return INVALID_ENTRY, [], []
    transposed = cols < rows
    info, col4row = solve(cost.t().contiguous() if transposed else cost)
    if info != SOLVED:
        return info, [], []
    if transposed:
        pairs = sorted((r, c) for c, r in enumerate(col4row))
        return info, [r for r, _ in pairs], [c for _, c in pairs]
    return info, list(range(rows)), col4row


def linear_sum_assignment(cost: torch.Tensor, sizes: torch.Tensor | None = None):
    """The op's outputs, computed here: ``(row_ind, col_ind, info)`` as ``torch.ops.lucid.linear_sum_assignment``
    returns them (docs/spec.md), on the device of ``cost``."""
    batched = cost.dim() == 3
    costs = cost if batched else cost.unsqueeze(0)
    n_problems, rows, cols = costs.shape
    k = min(rows, cols)
    widths = [cols] * n_problems if sizes is None else [int(s) for s in sizes.tolist()]
    row_ind = torch.full((n_problems, k), -1, dtype=torch.long)
    col_ind = torch.full((n_problems, k), -1, dtype=torch.long)
    info = torch.zeros(n_problems, dtype=torch.int32)
    for b in range(n_problems):
        if not 0 <= widths[b] <= cols:
            info[b] = BAD_SIZE
            continue
        status, r, c = solve_problem(costs[b, :, : widths[b]])
        info[b] = status
        if status == SOLVED:
            row_ind[b, : len(r)] = torch.tensor(r, dtype=torch.long)
            col_ind[b, : len(c)] = torch.tensor(c, dtype=torch.long)
    out = (row_ind.to(cost.device), col_ind.to(cost.device), info.to(cost.device))
    return out if batched else tuple(t.squeeze(0) for t in out)
