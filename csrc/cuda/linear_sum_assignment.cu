// torch.ops.lucid.linear_sum_assignment on the GPU (docs/spec.md, "Linear sum assignment"). One warp solves one
// problem with SciPy's shortest augmenting path: each step of the search scans the columns left in parallel (a lane
// takes every 32nd column) and picks SciPy's column by a warp reduction in the order of lsap.h (chosen_before); the
// steps between scans (SciPy's list of remaining columns, the duals, the flip along the path) are SciPy's.
//
// Two kernels. lsap_registers (up to 1,024 columns): each lane keeps its columns' state in registers (a compile-time
// number of columns per lane), reads each row of the cost in the solver's orientation (a transposed copy for tall
// problems, so that a warp's reads are contiguous), and settles each step with integer warp reductions. lsap_memory
// (any size): the state in shared memory, or in a global workspace for problems too large for it. Before either, a
// pass over every problem marks the ones holding NaN or -inf, as SciPy refuses them before it solves. Nothing is read
// back to the host.
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
constexpr int32_t kOnTree = -1;  // a column's position once the search has reached it
constexpr int32_t kAbsent = -2;  // a lane's slot past the last column

// Where the rows of problem b are, in the solver's orientation (a tall problem's rows are the cost's columns): entry
// (s, t) at base[s * stride_s + t * stride_t], widened exactly to float64. `transposed_cost`, when given, is the
// cost with its last two dimensions swapped, so that every row is contiguous.
template <typename T>
struct Costs {
  const T* base;
  int64_t stride_s, stride_t;
  __device__ Costs(const T* cost, const T* transposed_cost, int64_t b, int64_t R, int64_t C, bool transposed) {
    if (!transposed) {
      base = cost + b * R * C, stride_s = C, stride_t = 1;
    } else if (transposed_cost != nullptr) {
      base = transposed_cost + b * R * C, stride_s = R, stride_t = 1;
    } else {
      base = cost + b * R * C, stride_s = 1, stride_t = C;
    }
  }
  __device__ double operator()(int64_t s, int64_t t) const {
    return static_cast<double>(base[s * stride_s + t * stride_t]);
  }
};

// The problem's columns (its width) and whether it is solved, before any solver runs: -1 pairs, and info for the
// problems that end here (an empty one is solved, a size out of range is not, the check pass marked NaN or -inf).
// Returns false when the solver has nothing to do.
__device__ bool start_problem(int64_t b, int lane, int64_t R, int64_t C, const int64_t* sizes, int64_t K,
                              int64_t* rows, int64_t* cols, int32_t* info, int64_t& width) {
  for (int64_t k = lane; k < K; k += kWarp) rows[k] = cols[k] = -1;
  width = sizes ? sizes[b] : C;
  if (width < 0 || width > C) {
    if (lane == 0) info[b] = lsap::kBadSize;
    return false;
  }
  if (info[b] == lsap::kInvalidEntry) return false;  // SciPy refuses NaN and -inf before it solves
  if (R == 0 || width == 0) {
    if (lane == 0) info[b] = lsap::kSolved;
    return false;
  }
  return true;
}

// The check pass: info[b] = kInvalidEntry where problem b (its valid columns) holds NaN or -inf; info starts at 0.
// Every thread that finds one stores the same value.
template <typename T>
__global__ void lsap_check_kernel(const T* __restrict__ cost, int64_t B, int64_t R, int64_t C,
                                  const int64_t* __restrict__ sizes, int32_t* __restrict__ info) {
  const int64_t n = B * R * C;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = e / (R * C), c = e % C;
    if (c < (sizes ? sizes[b] : C) && lsap::invalid_entry(static_cast<double>(cost[e]))) {
      info[b] = lsap::kInvalidEntry;
    }
  }
}

// Writes SciPy's (row_ind, col_ind) of a transposed problem: the solver's columns are the original rows, matched in
// ascending order; `matched(t)` is the row matched to column t or -1. 32 columns a round, compacted by a ballot.
template <typename Matched>
__device__ void write_transposed_pairs(int64_t nc, int lane, int64_t* rows, int64_t* cols, Matched matched) {
  int64_t written = 0;
  for (int64_t base = 0; base < nc; base += kWarp) {
    const int64_t r = base + lane;
    const int32_t m = r < nc ? matched(r) : -1;
    const unsigned ballot = __ballot_sync(kFull, m >= 0);
    if (m >= 0) {
      const int64_t k = written + __popc(ballot & ((1u << lane) - 1u));
      rows[k] = r;
      cols[k] = m;
    }
    written += __popc(ballot);
  }
}

// ---- lsap_registers: up to 32 * L columns, each lane's in registers -------------------------------------------

// The least of 32-bit values over the warp.
__device__ __forceinline__ uint32_t warp_min(uint32_t x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  return __reduce_min_sync(kFull, x);
#else
  for (int offset = kWarp / 2; offset > 0; offset /= 2) x = min(x, __shfl_xor_sync(kFull, x, offset));
  return x;
#endif
}

// The lane holding the warp's least (cost, key) in lsap::chosen_before's order (costs are never NaN here): the
// cost's bits in an order that compares as the numbers do (-0 as +0), reduced 32 bits at a time, then the key.
__device__ __forceinline__ int warp_winner(double cost, uint32_t key) {
  uint64_t bits = static_cast<uint64_t>(__double_as_longlong(__dadd_rn(cost, 0.0)));  // -0 + 0 = +0
  bits = (bits >> 63) ? ~bits : (bits | (1ull << 63));
  const uint32_t hi = static_cast<uint32_t>(bits >> 32), lo = static_cast<uint32_t>(bits);
  const uint32_t min_hi = warp_min(hi);
  const uint32_t min_lo = warp_min(hi == min_hi ? lo : 0xFFFFFFFFu);
  const bool least = hi == min_hi && lo == min_lo;
  const uint32_t min_key = warp_min(least ? key : lsap::kNoColumn);
  return __ffs(__ballot_sync(kFull, least && key == min_key)) - 1;
}

// a[slot] for a slot known at run time, without indexing a register array at run time (which would move it to
// local memory).
template <int L, typename V>
__device__ __forceinline__ V pick(const V (&a)[L], int slot) {
  V out = a[0];
#pragma unroll
  for (int k = 1; k < L; ++k) {
    if (k == slot) out = a[k];
  }
  return out;
}

template <int L, typename V>
__device__ __forceinline__ void put(V (&a)[L], int slot, V value) {
#pragma unroll
  for (int k = 0; k < L; ++k) {
    if (k == slot) a[k] = value;
  }
}

// Shared memory of lsap_registers: the rows' duals and matches, and the row each column was reached from (written
// only when a column's path gets shorter, read only along the augmenting path).
struct RowState {
  double* u;
  int32_t* col4row;
  int32_t* path;
  static int64_t bytes(int64_t nr, int64_t nc) { return (12 * nr + 4 * nc + 15) / 16 * 16; }
  __device__ static RowState at(char* base, int64_t nr) {
    RowState s;
    s.u = reinterpret_cast<double*>(base);
    s.col4row = reinterpret_cast<int32_t*>(s.u + nr);
    s.path = s.col4row + nr;
    return s;
  }
};

template <typename T, int L>
__global__ void __launch_bounds__(kWarp) lsap_registers(const T* __restrict__ cost, const T* __restrict__ cost_t,
                                                         int64_t R, int64_t C, const int64_t* __restrict__ sizes,
                                                         int64_t K, int64_t* __restrict__ out_rows,
                                                         int64_t* __restrict__ out_cols, int32_t* __restrict__ info) {
  extern __shared__ __align__(16) char smem[];
  const int64_t b = blockIdx.x;
  const int lane = threadIdx.x;
  int64_t* rows = out_rows + b * K;
  int64_t* cols = out_cols + b * K;
  int64_t width;
  if (!start_problem(b, lane, R, C, sizes, K, rows, cols, info, width)) return;
  const bool transposed = lsap::solved_transposed(R, width);
  const int32_t nr = static_cast<int32_t>(transposed ? width : R), nc = static_cast<int32_t>(transposed ? R : width);
  const Costs<T> at(cost, cost_t, b, R, C, transposed);
  const RowState s = RowState::at(smem, nr);
  for (int32_t i = lane; i < nr; i += kWarp) {
    s.u[i] = 0;
    s.col4row[i] = -1;
  }
  // this lane's columns: lane + 32 k
  double v[L], spc[L];
  int32_t pos[L], match[L];
#pragma unroll
  for (int k = 0; k < L; ++k) {
    v[k] = 0;
    match[k] = -1;
  }
  __syncwarp();

  for (int32_t cur = 0; cur < nr; ++cur) {
    // a new search: every column in SciPy's list (the last column first), at an infinite distance
#pragma unroll
    for (int k = 0; k < L; ++k) {
      const int32_t t = lane + kWarp * k;
      spc[k] = lsap::kInf;
      pos[k] = t < nc ? nc - 1 - t : kAbsent;
    }
    double min_val = 0;
    int32_t i = cur, left = nc, sink = -1;
    while (sink < 0) {
      const double u_i = s.u[i];
      const T* row = at.base + i * at.stride_s;
      T c[L];
#pragma unroll
      for (int k = 0; k < L; ++k) c[k] = pos[k] >= 0 ? row[(lane + kWarp * k) * at.stride_t] : T(0);
      double best = lsap::kInf;
      uint32_t best_key = lsap::kNoColumn;
      int best_slot = 0;
#pragma unroll
      for (int k = 0; k < L; ++k) {
        if (pos[k] < 0) continue;
        const double r = lsap::path_cost(min_val, static_cast<double>(c[k]), u_i, v[k]);
        if (r < spc[k]) {
          s.path[lane + kWarp * k] = i;
          spc[k] = r;
        }
        const uint32_t key = lsap::scan_key(match[k] == -1, pos[k]);
        if (lsap::chosen_before(spc[k], key, best, best_key)) {
          best = spc[k];
          best_key = key;
          best_slot = k;
        }
      }
      const int winner = warp_winner(best, best_key);
      min_val = __shfl_sync(kFull, best, winner);
      if (min_val == lsap::kInf) {  // every column left is out of reach
        if (lane == 0) info[b] = lsap::kInfeasible;
        return;
      }
      const int32_t p = lsap::key_position(__shfl_sync(kFull, best_key, winner));
      const int slot = __shfl_sync(kFull, best_slot, winner);
      const int32_t matched_row = __shfl_sync(kFull, pick(match, slot), winner);
      // SciPy's removal: the last column of its list takes the chosen one's place
      --left;
#pragma unroll
      for (int k = 0; k < L; ++k) {
        if (pos[k] == left) pos[k] = p;
      }
      if (lane == winner) put(pos, slot, kOnTree);
      if (matched_row == -1) {
        sink = winner + kWarp * slot;
      } else {
        i = matched_row;
      }
    }
    // the duals: each column on the tree, and the row it brought onto the tree (all but row cur)
    if (lane == 0) s.u[cur] += min_val;
#pragma unroll
    for (int k = 0; k < L; ++k) {
      if (pos[k] != kOnTree) continue;
      const double d = min_val - spc[k];
      if (match[k] >= 0) s.u[match[k]] += d;
      v[k] -= d;
    }
    __syncwarp();
    // the flip along the path from the sink back to row cur
    int32_t j = sink;
    while (true) {
      const int32_t r = s.path[j];
      const int32_t next = s.col4row[r];
      if (lane == (j & (kWarp - 1))) put(match, j / kWarp, r);
      __syncwarp();
      if (lane == 0) s.col4row[r] = j;
      __syncwarp();
      j = next;
      if (r == cur) break;
    }
  }
  if (!transposed) {
    for (int32_t r = lane; r < nr; r += kWarp) {
      rows[r] = r;
      cols[r] = s.col4row[r];
    }
  } else {
    // rounds of 32 consecutive columns: round k is every lane's slot k
    int64_t written = 0;
#pragma unroll
    for (int k = 0; k < L; ++k) {
      const int32_t m = match[k];
      const unsigned ballot = __ballot_sync(kFull, m >= 0);
      if (m >= 0) {
        const int64_t at_k = written + __popc(ballot & ((1u << lane) - 1u));
        rows[at_k] = lane + kWarp * k;
        cols[at_k] = m;
      }
      written += __popc(ballot);
    }
  }
  if (lane == 0) info[b] = lsap::kSolved;
}

// ---- lsap_memory: any size, the state in memory -------------------------------------------------------------

// The solver's state of one problem of nr <= nc (bytes: 32 per column and 13 per row, doubles first).
struct State {
  double* v;           // (nc) column duals
  double* spc;         // (nc) shortest-path cost of each column in the current search
  int32_t* path;       // (nc) the row each column was reached from
  int32_t* row4col;    // (nc) the row matched to each column, -1 free
  int32_t* position;   // (nc) the column's place in SciPy's `remaining` list; kOnTree once reached
  int32_t* remaining;  // (nc) SciPy's list of the columns not yet on the tree
  double* u;           // (nr) row duals
  int32_t* col4row;    // (nr) the column matched to each row
  uint8_t* on_tree;    // (nr) rows reached by the current search

  static int64_t bytes(int64_t nr, int64_t nc) {
    const int64_t b = 32 * nc + 13 * nr;
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

template <typename T>
__global__ void __launch_bounds__(kWarp) lsap_memory(const T* __restrict__ cost, const T* __restrict__ cost_t,
                                                      int64_t R, int64_t C, const int64_t* __restrict__ sizes,
                                                      int64_t K, char* workspace, int64_t state_bytes,
                                                      int64_t* __restrict__ out_rows, int64_t* __restrict__ out_cols,
                                                      int32_t* __restrict__ info) {
  extern __shared__ __align__(16) char smem[];
  const int64_t b = blockIdx.x;
  const int lane = threadIdx.x;
  int64_t* rows = out_rows + b * K;
  int64_t* cols = out_cols + b * K;
  int64_t width;
  if (!start_problem(b, lane, R, C, sizes, K, rows, cols, info, width)) return;
  const bool transposed = lsap::solved_transposed(R, width);
  const int64_t nr = transposed ? width : R, nc = transposed ? R : width;
  const Costs<T> at(cost, cost_t, b, R, C, transposed);
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
  if (!transposed) {
    for (int64_t r = lane; r < nr; r += kWarp) {
      rows[r] = r;
      cols[r] = s.col4row[r];
    }
  } else {
    write_transposed_pairs(nc, lane, rows, cols, [&](int64_t r) { return s.row4col[r]; });
  }
  if (lane == 0) info[b] = lsap::kSolved;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> linear_sum_assignment_cuda(const at::Tensor& cost,
                                                                         const std::optional<at::Tensor>& sizes) {
  const LsapDims d = check_linear_sum_assignment_args(cost, sizes);
  const c10::cuda::CUDAGuard guard(cost.device());
  const auto index_opts = cost.options().dtype(at::kLong);
  auto rows = at::empty({d.B, d.K}, index_opts);
  auto cols = at::empty({d.B, d.K}, index_opts);
  auto info = at::zeros({d.B}, cost.options().dtype(at::kInt));
  if (d.B > 0) {
    TORCH_CHECK_VALUE(d.B <= std::numeric_limits<int32_t>::max(), "cost: at most 2^31 - 1 problems, got ", d.B);
    const auto c = cost.contiguous();
    // sizes on the CPU were checked by check_linear_sum_assignment_args; their copy does not wait for the GPU
    const auto n = sizes.has_value() ? sizes->to(cost.device(), at::kLong, /*non_blocking=*/true) : at::Tensor();
    // tall problems are solved transposed: a transposed copy makes each of their rows contiguous
    const bool some_tall = d.R > 1 && (sizes.has_value() || d.C < d.R);
    const auto ct = some_tall ? c.transpose(-1, -2).contiguous() : at::Tensor();
    const int64_t nr = d.K, nc = std::max(d.R, d.C);
    const int64_t lanes_columns = (nc + kWarp - 1) / kWarp;
    const auto stream = at::cuda::getCurrentCUDAStream();
    const int64_t* n_ptr = n.defined() ? n.data_ptr<int64_t>() : nullptr;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, c.scalar_type(), "linear_sum_assignment_cuda", [&] {
      using T = scalar_t;
      const T* c_ptr = c.data_ptr<T>();
      const T* ct_ptr = ct.defined() ? ct.data_ptr<T>() : nullptr;
      const int64_t elements = d.B * d.R * d.C;
      if (elements > 0) {
        const int64_t sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
        const unsigned grid = static_cast<unsigned>(std::min<int64_t>(blocks_for(elements), 8 * sms));
        lsap_check_kernel<T><<<grid, kThreads, 0, stream>>>(c_ptr, d.B, d.R, d.C, n_ptr, info.data_ptr<int32_t>());
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      }
      const auto launch_registers = [&](auto kernel) {
        const int64_t smem = RowState::bytes(nr, nc);
        kernel<<<static_cast<unsigned>(d.B), kWarp, static_cast<size_t>(smem), stream>>>(
            c_ptr, ct_ptr, d.R, d.C, n_ptr, d.K, rows.data_ptr<int64_t>(), cols.data_ptr<int64_t>(),
            info.data_ptr<int32_t>());
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      };
      if (lanes_columns <= 1) return launch_registers(lsap_registers<T, 1>);
      if (lanes_columns <= 2) return launch_registers(lsap_registers<T, 2>);
      if (lanes_columns <= 4) return launch_registers(lsap_registers<T, 4>);
      if (lanes_columns <= 8) return launch_registers(lsap_registers<T, 8>);
      if (lanes_columns <= 12) return launch_registers(lsap_registers<T, 12>);
      if (lanes_columns <= 16) return launch_registers(lsap_registers<T, 16>);
      if (lanes_columns <= 20) return launch_registers(lsap_registers<T, 20>);
      // wider problems: the state in shared memory, or in a global workspace when too large for it
      const int64_t state_bytes = State::bytes(nr, nc);
      const bool in_smem = state_bytes <= at::cuda::getCurrentDeviceProperties()->sharedMemPerBlockOptin;
      const auto workspace = in_smem ? at::Tensor() : at::empty({d.B * state_bytes}, cost.options().dtype(at::kByte));
      const auto kernel = lsap_memory<T>;
      const int64_t smem = in_smem ? state_bytes : 0;
      if (smem > 48 * 1024) raise_smem_limit(kernel, smem);
      kernel<<<static_cast<unsigned>(d.B), kWarp, static_cast<size_t>(smem), stream>>>(
          c_ptr, ct_ptr, d.R, d.C, n_ptr, d.K, in_smem ? nullptr : static_cast<char*>(workspace.data_ptr()),
          state_bytes, rows.data_ptr<int64_t>(), cols.data_ptr<int64_t>(), info.data_ptr<int32_t>());
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
