// torch.ops.lucid.linear_sum_assignment on the GPU (docs/spec.md, "Linear sum assignment"). One warp solves one
// problem with SciPy's shortest augmenting path: each step of the search scans the columns left in parallel (a lane
// takes every 32nd column) and picks SciPy's column by a warp reduction in the order of lsap.h (chosen_before); the
// steps between scans (SciPy's list of remaining columns, the duals, the flip along the path) are SciPy's, in shared
// memory, or in a global workspace for problems too large for it. Nothing is read back to the host.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>

#include "checks.h"
#include "cuda/launch.cuh"
#include "lsap.h"

namespace lucid {
namespace gpu {
namespace {

constexpr int kWarp = 32;
constexpr unsigned kFull = 0xFFFFFFFFu;

// The solver's state of one problem of nr <= nc (bytes: 28 per column and 13 per row, doubles first).
struct State {
  double* v;           // (nc) column duals
  double* spc;         // (nc) shortest-path cost of each column in the current search
  int32_t* path;       // (nc) the row each column was reached from
  int32_t* row4col;    // (nc) the row matched to each column, -1 free
  int32_t* position;   // (nc) the column's place in SciPy's `remaining` list; -1 once on the tree
  int32_t* remaining;  // (nc) SciPy's list of the columns not yet on the tree
  double* u;           // (nr) row duals
  int32_t* col4row;    // (nr) the column matched to each row
  uint8_t* on_tree;    // (nr) rows reached by the current search

  static int64_t bytes(int64_t nr, int64_t nc) {
    const int64_t b = 28 * nc + 13 * nr;
    return (b + 15) / 16 * 16;
  }
  __device__ static State at(char* base, int64_t nr, int64_t nc) {
    State s;
    s.v = reinterpret_cast<double*>(base);
    s.spc = s.v + nc;
    s.u = s.spc + nc;
    s.path = reinterpret_cast<int32_t*>(s.u + nr);
    s.row4col = s.path + nc;
    s.position = s.row4col + nc;
    s.remaining = s.position + nc;
    s.col4row = s.remaining + nc;
    s.on_tree = reinterpret_cast<uint8_t*>(s.col4row + nr);
    return s;
  }
};

// Entry (s, t) of the solver's problem, widened exactly to float64.
template <typename T>
struct Costs {
  const T* base;
  int64_t stride_s, stride_t;
  __device__ double operator()(int64_t s, int64_t t) const {
    return static_cast<double>(base[s * stride_s + t * stride_t]);
  }
};

// The warp's choice: the least (cost, key) over its lanes (lsap::chosen_before), known to every lane.
__device__ void warp_choose(double& cost, uint32_t& key) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    const double c = __shfl_xor_sync(kFull, cost, offset);
    const uint32_t k = __shfl_xor_sync(kFull, key, offset);
    if (lsap::chosen_before(c, k, cost, key)) {
      cost = c;
      key = k;
    }
  }
}

// Writes the problem's pairs: SciPy's (row_ind, col_ind) in ascending order of the original rows.
__device__ void write_pairs(const State& s, bool transposed, int64_t nr, int64_t nc, int lane, int64_t* rows,
                            int64_t* cols) {
  if (!transposed) {
    for (int64_t r = lane; r < nr; r += kWarp) {
      rows[r] = r;
      cols[r] = s.col4row[r];
    }
    return;
  }
  // the solver's columns are the original rows: compact the matched ones in order, 32 at a time
  int64_t written = 0;
  for (int64_t base = 0; base < nc; base += kWarp) {
    const int64_t r = base + lane;
    const bool matched = r < nc && s.row4col[r] >= 0;
    const unsigned ballot = __ballot_sync(kFull, matched);
    if (matched) {
      const int64_t k = written + __popc(ballot & ((1u << lane) - 1u));
      rows[k] = r;
      cols[k] = s.row4col[r];
    }
    written += __popc(ballot);
  }
}

template <typename T>
__global__ void __launch_bounds__(kWarp) lsap_kernel(const T* __restrict__ cost, int64_t R, int64_t C,
                                                      const int64_t* __restrict__ sizes, int64_t K, char* workspace,
                                                      int64_t state_bytes, int64_t* __restrict__ out_rows,
                                                      int64_t* __restrict__ out_cols, int32_t* __restrict__ info) {
  extern __shared__ __align__(16) char smem[];
  const int64_t b = blockIdx.x;
  const int lane = threadIdx.x;
  int64_t* rows = out_rows + b * K;
  int64_t* cols = out_cols + b * K;
  for (int64_t k = lane; k < K; k += kWarp) rows[k] = cols[k] = -1;
  const int64_t width = sizes ? sizes[b] : C;
  if (width < 0 || width > C) {
    if (lane == 0) info[b] = lsap::kBadSize;
    return;
  }
  if (R == 0 || width == 0) {
    if (lane == 0) info[b] = lsap::kSolved;
    return;
  }
  const bool transposed = lsap::solved_transposed(R, width);
  const int64_t nr = transposed ? width : R, nc = transposed ? R : width;
  const Costs<T> at{cost + b * R * C, transposed ? 1 : C, transposed ? C : 1};

  // SciPy refuses NaN and -inf anywhere in the problem before it solves
  bool invalid = false;
  for (int64_t r = 0; r < nr; ++r) {
#pragma unroll 4
    for (int64_t t = lane; t < nc; t += kWarp) invalid |= lsap::invalid_entry(at(r, t));
  }
  if (__any_sync(kFull, invalid)) {
    if (lane == 0) info[b] = lsap::kInvalidEntry;
    return;
  }

  const State s = State::at(workspace ? workspace + b * state_bytes : smem, nr, nc);
  for (int64_t t = lane; t < nc; t += kWarp) {
    s.v[t] = 0;
    s.row4col[t] = -1;
  }
  for (int64_t i = lane; i < nr; i += kWarp) {
    s.u[i] = 0;
    s.col4row[i] = -1;
  }
  __syncwarp();

  for (int64_t cur = 0; cur < nr; ++cur) {
    // a new search: every column left, in SciPy's order (the last column first), at an infinite distance
    for (int64_t t = lane; t < nc; t += kWarp) {
      s.spc[t] = lsap::kInf;
      s.position[t] = static_cast<int32_t>(nc - 1 - t);
      s.remaining[nc - 1 - t] = static_cast<int32_t>(t);
    }
    for (int64_t i = lane; i < nr; i += kWarp) s.on_tree[i] = 0;
    __syncwarp();
    double min_val = 0;
    int64_t i = cur, sink = -1, left = nc;
    while (sink < 0) {
      if (lane == 0) s.on_tree[i] = 1;
      const double u_i = s.u[i];
      double best = lsap::kInf;
      uint32_t best_key = lsap::kNoColumn;
      for (int64_t t = lane; t < nc; t += kWarp) {
        const int32_t p = s.position[t];
        if (p < 0) continue;
        const double r = lsap::path_cost(min_val, at(i, t), u_i, s.v[t]);
        double d = s.spc[t];
        if (r < d) {
          s.path[t] = static_cast<int32_t>(i);
          s.spc[t] = d = r;
        }
        const uint32_t key = lsap::scan_key(s.row4col[t] == -1, p);
        if (lsap::chosen_before(d, key, best, best_key)) {
          best = d;
          best_key = key;
        }
      }
      warp_choose(best, best_key);
      if (best == lsap::kInf) {  // every column left is out of reach
        for (int64_t k = lane; k < K; k += kWarp) rows[k] = cols[k] = -1;
        if (lane == 0) info[b] = lsap::kInfeasible;
        return;
      }
      min_val = best;
      const int32_t p = lsap::key_position(best_key);
      const int32_t j = s.remaining[p];
      const int32_t matched_row = s.row4col[j];
      __syncwarp();
      if (lane == 0) {  // SciPy's removal: the last column of the list takes the chosen one's place
        const int32_t moved = s.remaining[--left];
        s.remaining[p] = moved;
        s.position[moved] = p;
        s.position[j] = -1;
      } else {
        --left;
      }
      __syncwarp();
      if (matched_row == -1) {
        sink = j;
      } else {
        i = matched_row;
      }
    }

    // the duals of the rows and columns on the tree, then the flip along the path from the sink back to row cur
    for (int64_t r = lane; r < nr; r += kWarp) {
      if (r == cur) {
        s.u[r] += min_val;
      } else if (s.on_tree[r]) {
        s.u[r] += min_val - s.spc[s.col4row[r]];
      }
    }
    for (int64_t t = lane; t < nc; t += kWarp) {
      if (s.position[t] < 0) s.v[t] -= min_val - s.spc[t];
    }
    __syncwarp();
    if (lane == 0) {
      int64_t j = sink;
      while (true) {
        const int32_t r = s.path[j];
        s.row4col[j] = r;
        const int32_t next = s.col4row[r];
        s.col4row[r] = static_cast<int32_t>(j);
        j = next;
        if (r == cur) break;
      }
    }
    __syncwarp();
  }
  write_pairs(s, transposed, nr, nc, lane, rows, cols);
  if (lane == 0) info[b] = lsap::kSolved;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> linear_sum_assignment_cuda(const at::Tensor& cost,
                                                                         const std::optional<at::Tensor>& sizes) {
  const LsapDims d = check_linear_sum_assignment_args(cost, sizes);
  const c10::cuda::CUDAGuard guard(cost.device());
  const auto index_opts = cost.options().dtype(at::kLong);
  auto rows = at::empty({d.B, d.K}, index_opts);
  auto cols = at::empty({d.B, d.K}, index_opts);
  auto info = at::empty({d.B}, cost.options().dtype(at::kInt));
  if (d.B > 0) {
    TORCH_CHECK_VALUE(d.B <= std::numeric_limits<int32_t>::max(), "cost: at most 2^31 - 1 problems, got ", d.B);
    const auto c = cost.contiguous();
    // sizes on the CPU were checked by check_linear_sum_assignment_args; their copy does not wait for the GPU
    const auto n = sizes.has_value() ? sizes->to(cost.device(), at::kLong, /*non_blocking=*/true) : at::Tensor();
    const int64_t nr = d.K, nc = std::max(d.R, d.C);
    const int64_t state_bytes = State::bytes(nr, nc);
    const int64_t smem_limit = at::cuda::getCurrentDeviceProperties()->sharedMemPerBlockOptin;
    const bool in_smem = state_bytes <= smem_limit;
    const auto workspace =
        in_smem ? at::Tensor() : at::empty({d.B * state_bytes}, cost.options().dtype(at::kByte));
    const auto stream = at::cuda::getCurrentCUDAStream();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, c.scalar_type(), "linear_sum_assignment_cuda", [&] {
      const auto kernel = lsap_kernel<scalar_t>;
      const int64_t smem = in_smem ? state_bytes : 0;
      if (smem > 48 * 1024) raise_smem_limit(kernel, smem);
      kernel<<<static_cast<unsigned>(d.B), kWarp, static_cast<size_t>(smem), stream>>>(
          c.data_ptr<scalar_t>(), d.R, d.C, n.defined() ? n.data_ptr<int64_t>() : nullptr, d.K,
          in_smem ? nullptr : static_cast<char*>(workspace.data_ptr()), state_bytes, rows.data_ptr<int64_t>(),
          cols.data_ptr<int64_t>(), info.data_ptr<int32_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  }
  if (!d.batched) return {rows.squeeze(0), cols.squeeze(0), info.squeeze(0)};
  return {rows, cols, info};
}

}  // namespace

TORCH_LIBRARY_IMPL(lucid, CUDA, m) { m.impl("linear_sum_assignment", &linear_sum_assignment_cuda); }

}  // namespace gpu
}  // namespace lucid
