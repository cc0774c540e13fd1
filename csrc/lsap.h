// The linear sum assignment's rules on single values, shared by the CPU and CUDA solvers: torch-free, header-only,
// host and device. docs/spec.md ("Linear sum assignment") states them; lucid_assign/lsap.py is their readable
// reference. The solver is the shortest augmenting path of Crouse (2016) as SciPy runs it, and every choice it makes
// is made here, so that both backends choose as SciPy does on every input, ties included.
#pragma once

#include <cstdint>
#include <limits>

#include "geometry.h"

namespace lucid {
namespace lsap {

// What a problem came to (the op's `info` output).
enum Info : int32_t {
  kSolved = 0,
  kInvalidEntry = 1,  // the cost holds NaN or -inf (SciPy: "matrix contains invalid numeric entries")
  kInfeasible = 2,    // no complete matching avoids +inf (SciPy: "cost matrix is infeasible")
  kBadSize = 3,       // sizes[b] outside [0, C] (only sizes that live on the GPU are checked this late)
};

constexpr double kInf = std::numeric_limits<double>::infinity();

// The most rows and columns a cost may have (checks.h refuses larger ones): positions in SciPy's list of columns and
// the CUDA solver's keys (scan_key) stay below 2^30, and every index of one problem fits in int32.
constexpr int64_t kMaxSide = std::numeric_limits<int32_t>::max() / 2;

// An entry SciPy refuses before solving: NaN or -inf. +inf is a forbidden pair.
LUCID_HD bool invalid_entry(double c) { return c != c || c == -kInf; }

// The solver works on the problem with no more rows than columns: a tall (R > C) cost is solved transposed, its
// columns as the solver's rows (SciPy's rule), and the matches are read back in ascending order of the original rows.
LUCID_HD bool solved_transposed(int64_t rows, int64_t cols) { return cols < rows; }

// The reduced cost of column j seen from row i during the search of one augmenting path: the path's length so far
// plus the cost, less the duals, rounded left to right in float64 as SciPy adds them.
LUCID_HD double path_cost(double min_val, double cost, double u_i, double v_j) {
  return geom::sub(geom::sub(geom::add(min_val, cost), u_i), v_j);
}

// Problem b's columns (its width: sizes[b], or all C without sizes) and what it comes to before any search: kSolved
// for an empty one (no rows or no columns), kBadSize for a size outside [0, C], or -1 when the solver has work.
LUCID_HD int32_t start_problem(int64_t b, int64_t R, int64_t C, const int64_t* sizes, int64_t& width) {
  width = sizes ? sizes[b] : C;
  if (width < 0 || width > C) return kBadSize;
  if (R == 0 || width == 0) return kSolved;
  return -1;
}

// The matching flipped along the augmenting path from its sink column back to row `cur`: each column on the path
// takes the row it was reached from (path), and each such row the column after it.
template <typename Index, typename RowIndex>
LUCID_HD void flip_path(const Index* path, Index* row4col, RowIndex* col4row, int64_t cur, int64_t sink) {
  int64_t j = sink;
  while (true) {
    const int64_t i = path[j];
    row4col[j] = static_cast<Index>(i);
    const int64_t next = col4row[i];
    col4row[i] = static_cast<RowIndex>(j);
    j = next;
    if (i == cur) return;
  }
}

// SciPy's (row_ind, col_ind) of a solved problem of nr <= nc, written by `lanes` workers together (this one is
// `lane`): each row in turn with its column, or, for a problem solved transposed (its columns the original rows),
// the original rows that are matched, in ascending order, with their columns. `col_of(i)` is the column matched to
// row i, `row_of(t)` the row matched to column t (-1: none); `ranks(matched, total)` gives the number of the lanes
// before this one in the same round of `lanes` columns that are matched, and sets `total` to the round's count.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable  // the functors are the caller's: device-only in a kernel, host-only on the CPU
#endif
template <typename ColOf, typename RowOf, typename Ranks>
LUCID_HD void write_pairs(bool transposed, int64_t nr, int64_t nc, int lane, int lanes, ColOf col_of, RowOf row_of,
                          Ranks ranks, int64_t* rows, int64_t* cols) {
  if (!transposed) {
    for (int64_t r = lane; r < nr; r += lanes) {
      rows[r] = r;
      cols[r] = col_of(r);
    }
    return;
  }
  int64_t written = 0;
  for (int64_t base = 0; base < nc; base += lanes) {
    const int64_t r = base + lane;
    const int64_t m = r < nc ? row_of(r) : -1;
    int64_t total = 0;
    const int64_t k = written + ranks(m >= 0, total);
    if (m >= 0) {
      rows[k] = r;
      cols[k] = m;
    }
    written += total;
  }
}

// The other form of a solved problem's result, each row's column (the row form of the Python API's batches): for a
// problem solved as it is, column col_of(r) of each of its nr rows; solved transposed (its columns the original
// rows), row_of(t) of each of its nc columns (-1: none). Written by `lanes` workers together (this one is `lane`).
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <typename ColOf, typename RowOf>
LUCID_HD void write_columns(bool transposed, int64_t nr, int64_t nc, int lane, int lanes, ColOf col_of, RowOf row_of,
                            int64_t* columns) {
  const int64_t n = transposed ? nc : nr;
  for (int64_t r = lane; r < n; r += lanes) columns[r] = transposed ? row_of(r) : col_of(r);
}

// Where one problem's result goes: SciPy's pairs (rows and cols, K each, -1 after the last), or, `per_row`, each of
// its R rows' column (-1: none) in `columns`. clear() writes the result of a problem with no pairs.
struct Result {
  int64_t* rows;
  int64_t* cols;
  int64_t* columns;
  int64_t K, R;
  bool per_row;
  LUCID_HD Result at(int64_t b) const {
    return per_row ? Result{nullptr, nullptr, columns + b * R, K, R, true}
                   : Result{rows + b * K, cols + b * K, nullptr, K, R, false};
  }
  LUCID_HD void clear(int lane, int lanes) const {
    if (per_row) {
      for (int64_t r = lane; r < R; r += lanes) columns[r] = -1;
    } else {
      for (int64_t k = lane; k < K; k += lanes) rows[k] = cols[k] = -1;
    }
  }
};

// SciPy's scan over the columns not yet on the tree, in the order of its `remaining` list: a column is taken when
// its shortest-path cost is below the lowest so far, or equal to it and the column is free (unmatched; `is_free()`
// is asked only then, as SciPy reads the match only then). The CPU solver scans in that order with this rule.
template <typename IsFree>
LUCID_HD bool scan_takes(double cost, double lowest, IsFree is_free) {
  return cost < lowest || (cost == lowest && is_free());
}

// The same choice as an order, for a parallel reduction (the CUDA solver): the column the scan ends on is the least
// of all columns by (cost, scan_key). Costs compare as numbers (-0 and +0 tie); at equal cost a free column comes
// before a matched one, free columns by descending position in `remaining` (the scan takes every later free one) and
// matched columns by ascending position (the scan keeps the first). Positions are below 2^30 (kMaxSide).
constexpr uint32_t kMatchedKeys = 0x40000000u;
constexpr uint32_t kNoColumn = 0xFFFFFFFFu;  // a lane with no column left: after every column
// A lane that read NaN or -inf in the row a search starts from offers (-inf, kInvalidKey), before every column: no
// column's key is 0 (positions stay below kMaxSide), so the chosen key says the problem is refused.
constexpr uint32_t kInvalidKey = 0u;

LUCID_HD uint32_t scan_key(bool free, int32_t position) {
  return free ? kMatchedKeys - 1u - static_cast<uint32_t>(position) : kMatchedKeys + static_cast<uint32_t>(position);
}

LUCID_HD int32_t key_position(uint32_t key) {
  return static_cast<int32_t>(key >= kMatchedKeys ? key - kMatchedKeys : kMatchedKeys - 1u - key);
}

LUCID_HD bool chosen_before(double cost_a, uint32_t key_a, double cost_b, uint32_t key_b) {
  return cost_a < cost_b || (cost_a == cost_b && key_a < key_b);
}

}  // namespace lsap
}  // namespace lucid
