// torch.ops.lucid.linear_sum_assignment on the CPU (docs/spec.md, "Linear sum assignment"): the problems of a batch
// are independent tasks; each is SciPy's shortest augmenting path, run as SciPy runs it on a float64 copy of the
// problem in the orientation the solver takes (lsap.h holds every rule it applies).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "entries.h"
#include "lsap.h"

namespace lucid {
namespace cpu {
namespace {

// The solver's state for one problem of nr <= nc, reused by the problems of one task.
class Solver {
 public:
  // The problem's cost, row-major (nr, nc), filled by the caller before solve().
  std::vector<double> cost;

  // Solves the nr x nc problem in `cost`; returns lsap::Info. col4row() holds the result.
  int32_t solve(int64_t nr, int64_t nc) {
    u_.assign(nr, 0.0);
    v_.assign(nc, 0.0);
    spc_.resize(nc);
    path_.assign(nc, -1);
    col4row_.assign(nr, -1);
    row4col_.assign(nc, -1);
    in_rows_.resize(nr);
    in_cols_.resize(nc);
    remaining_.resize(nc);
    for (int64_t cur = 0; cur < nr; ++cur) {
      double min_val = 0;
      const int64_t sink = shortest_path(nr, nc, cur, &min_val);
      if (sink < 0) return lsap::kInfeasible;
      update_duals(nr, nc, cur, min_val);
      augment(cur, sink);
    }
    return lsap::kSolved;
  }

  const std::vector<int64_t>& col4row() const { return col4row_; }
  const std::vector<int64_t>& row4col() const { return row4col_; }

 private:
  // Dijkstra's search from row `cur` over the reduced costs, to the first free column it reaches (the sink); -1 when
  // every column left is at an infinite distance.
  int64_t shortest_path(int64_t nr, int64_t nc, int64_t cur, double* min_out) {
    int64_t left = nc;
    for (int64_t it = 0; it < nc; ++it) remaining_[it] = nc - it - 1;  // SciPy's order: the last column first
    std::fill(in_rows_.begin(), in_rows_.begin() + nr, 0);
    std::fill(in_cols_.begin(), in_cols_.begin() + nc, 0);
    std::fill(spc_.begin(), spc_.begin() + nc, lsap::kInf);
    double min_val = 0;
    int64_t i = cur;
    while (true) {
      in_rows_[i] = 1;
      const double* row = cost.data() + i * nc;
      const double u_i = u_[i];
      int64_t index = -1;
      double lowest = lsap::kInf;
      for (int64_t it = 0; it < left; ++it) {
        const int64_t j = remaining_[it];
        const double r = lsap::path_cost(min_val, row[j], u_i, v_[j]);
        if (r < spc_[j]) {
          path_[j] = i;
          spc_[j] = r;
        }
        const double d = spc_[j];
        if (lsap::scan_takes(d, lowest, [&] { return row4col_[j] == -1; })) {
          lowest = d;
          index = it;
        }
      }
      min_val = lowest;
      if (min_val == lsap::kInf) return -1;
      const int64_t j = remaining_[index];
      in_cols_[j] = 1;
      remaining_[index] = remaining_[--left];
      if (row4col_[j] == -1) {
        *min_out = min_val;
        return j;
      }
      i = row4col_[j];
    }
  }

  void update_duals(int64_t nr, int64_t nc, int64_t cur, double min_val) {
    u_[cur] += min_val;
    for (int64_t i = 0; i < nr; ++i) {
      if (in_rows_[i] && i != cur) u_[i] += min_val - spc_[col4row_[i]];
    }
    for (int64_t j = 0; j < nc; ++j) {
      if (in_cols_[j]) v_[j] -= min_val - spc_[j];
    }
  }

  void augment(int64_t cur, int64_t sink) {
    lsap::flip_path(path_.data(), row4col_.data(), col4row_.data(), cur, sink);
  }

  std::vector<double> u_, v_, spc_;
  std::vector<int64_t> path_, col4row_, row4col_, remaining_;
  std::vector<char> in_rows_, in_cols_;
};

// Problem b of the batch: rows R, columns C (the row stride), solved into `out` (this problem's lsap::Result).
template <typename T>
int32_t solve_problem(Solver& s, const T* cost, int64_t b, int64_t R, int64_t C, const int64_t* sizes,
                      const lsap::Result& out) {
  out.clear(0, 1);
  int64_t cols = 0;
  const int32_t ended = lsap::start_problem(b, R, C, sizes, cols);
  if (ended >= 0) return ended;
  const bool transposed = lsap::solved_transposed(R, cols);
  const int64_t nr = transposed ? cols : R, nc = transposed ? R : cols;
  s.cost.resize(nr * nc);
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const double x = static_cast<double>(cost[r * C + c]);
      if (lsap::invalid_entry(x)) return lsap::kInvalidEntry;
      s.cost[transposed ? c * nc + r : r * nc + c] = x;
    }
  }
  const int32_t info = s.solve(nr, nc);
  if (info != lsap::kSolved) return info;
  const auto one_lane = [](bool matched, int64_t& total) -> int64_t {
    total = matched ? 1 : 0;
    return 0;
  };
  const auto col_of = [&](int64_t i) { return s.col4row()[i]; };
  const auto row_of = [&](int64_t t) { return s.row4col()[t]; };
  if (out.per_row) {
    lsap::write_columns(transposed, nr, nc, 0, 1, col_of, row_of, out.columns);
  } else {
    lsap::write_pairs(transposed, nr, nc, 0, 1, col_of, row_of, one_lane, out.rows, out.cols);
  }
  return lsap::kSolved;
}

void solve_cpu(const LsapDims& d, const at::Tensor& cost, const std::optional<at::Tensor>& sizes,
               const lsap::Result& out, at::Tensor& info) {
  const auto c = cost.contiguous();
  const auto n = sizes.has_value() ? sizes->to(at::kLong).contiguous() : at::Tensor();
  const int64_t* n_ptr = n.defined() ? n.data_ptr<int64_t>() : nullptr;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, c.scalar_type(), "linear_sum_assignment_cpu", [&] {
    const scalar_t* base = c.data_ptr<scalar_t>();
    int32_t* i_ptr = info.data_ptr<int32_t>();
    at::parallel_for(0, d.B, 1, [&](int64_t begin, int64_t end) {
      Solver s;
      for (int64_t b = begin; b < end; ++b) {
        i_ptr[b] = solve_problem(s, base + b * d.R * d.C, b, d.R, d.C, n_ptr, out.at(b));
      }
    });
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(lucid, CPU, m) { LsapEntry<solve_cpu>::register_in(m); }

}  // namespace cpu
}  // namespace lucid
