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
// matched columns by ascending position (the scan keeps the first). Positions are below 2^30 (checks.h).
constexpr uint32_t kMatchedKeys = 0x40000000u;
constexpr uint32_t kNoColumn = 0xFFFFFFFFu;  // a lane with no column left: after every column

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
