// torch.ops.lucid.linear_sum_assignment on the GPU (docs/spec.md, "Linear sum assignment"). One block solves one
// problem with SciPy's shortest augmenting path: each step of the search scans the columns left in parallel and picks
// SciPy's column by reductions in the order of lsap.h (chosen_before); the steps between scans (SciPy's list of
// remaining columns, the duals, the flip along the path) are SciPy's.
//
// Two kernels. lsap_registers (up to 1,024 columns): a block of W = 1, 2, 4 or 8 warps (a compile-time W, chosen by
// the problem's columns: registers_warps), each thread keeping its columns' state in registers (at most 4 columns),
// reads each row of the cost in the solver's orientation (for tall problems a transposed copy, so that a warp's reads
// are contiguous, unless every row fits the cache) and keeps the rows it has read in shared memory where they fit;
// each step every thread picks its least column by a tree, every warp settles its lanes by integer warp reductions and
// the warps' winners meet in shared memory, one barrier a step (none for one warp). A step is a chain of dependent
// instructions (Nsight Compute: each waits on the one before), so several warps (on the SM's four schedulers) with
// few columns each beat one warp with many.
// lsap_memory (any size): one warp, the state in shared memory, or in a global workspace for problems too large for
// it. SciPy refuses a cost holding NaN or -inf before it solves; each solver checks each row at the first step of the
// search that starts from it (every row starts one, and is read whole there), and, where a search finds no column in
// reach, the rows after it, so that such a problem ends refused, never infeasible. One launch; nothing is read back
// to the host.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <type_traits>

#include "cuda/launch.cuh"
#include "entries.h"
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

// The problem's columns (its width) and whether the solver has work, before any solver runs: a result with no pairs
// (`out`, this problem's), and info for the problems that end here (lsap::start_problem).
__device__ bool start_problem(int64_t b, int thread, int threads, int64_t R, int64_t C, const int64_t* sizes,
                              const lsap::Result& out, int32_t* info, int64_t& width) {
  out.clear(thread, threads);
  const int32_t ended = lsap::start_problem(b, R, C, sizes, width);
  if (ended == lsap::kBadSize) {
    if (thread == 0) info[b] = ended;
    return false;
  }
  if (ended == lsap::kSolved) {
    if (thread == 0) info[b] = lsap::kSolved;
    return false;
  }
  return true;
}

// How a search that found no column in reach ends the problem: refused where a row after `cur` (rows up to `cur`
// were checked by their searches) holds NaN or -inf, as SciPy checks the whole cost first, else infeasible. Each of
// `threads` workers (this one is `worker`) reads its columns t = worker + threads k of those rows; `any(found)` is
// true where any worker found one.
template <typename T, typename Any>
__device__ int32_t unreachable_ends(const Costs<T>& at, int64_t cur, int64_t nr, int64_t nc, int worker, int threads,
                                    Any any) {
  bool found = false;
  for (int64_t i = cur + 1; i < nr && !found; ++i) {
    for (int64_t t = worker; t < nc; t += threads) found |= lsap::invalid_entry(at(i, t));
  }
  return any(found) ? lsap::kInvalidEntry : lsap::kInfeasible;
}

// A solved problem's result: each row's column (lsap::write_columns) by every thread of the block, or SciPy's
// (row_ind, col_ind) (lsap::write_pairs): a problem in the solver's orientation by every thread of the block, a
// transposed one by the first warp (its rounds' matched columns counted by a ballot).
template <typename ColOf, typename RowOf>
__device__ void write_results(bool transposed, int64_t nr, int64_t nc, int tid, int threads, ColOf col_of,
                              RowOf row_of, const lsap::Result& out) {
  if (out.per_row) return lsap::write_columns(transposed, nr, nc, tid, threads, col_of, row_of, out.columns);
  int64_t* rows = out.rows;
  int64_t* cols = out.cols;
  const int lane = tid & (kWarp - 1);
  const auto ranks = [lane](bool matched, int64_t& total) -> int64_t {
    const unsigned ballot = __ballot_sync(kFull, matched);
    total = __popc(ballot);
    return __popc(ballot & ((1u << lane) - 1u));
  };
  if (!transposed) {
    lsap::write_pairs(false, nr, nc, tid, threads, col_of, row_of, ranks, rows, cols);
  } else if (tid < kWarp) {
    lsap::write_pairs(true, nr, nc, lane, kWarp, col_of, row_of, ranks, rows, cols);
  }
}

// ---- lsap_registers: up to 1,024 columns, each thread's in registers ------------------------------------------

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
// cost's bits in an order that compares as the numbers do (-0 as +0), reduced 32 bits at a time, then the key; a lane
// alone with the least high half (or, after the low half, alone with the least cost) wins without the reductions
// after it, and ties go to the least key, then the first lane.
__device__ __forceinline__ int warp_winner(double cost, uint32_t key) {
  uint64_t bits = static_cast<uint64_t>(__double_as_longlong(__dadd_rn(cost, 0.0)));  // -0 + 0 = +0
  bits = (bits >> 63) ? ~bits : (bits | (1ull << 63));
  const uint32_t hi = static_cast<uint32_t>(bits >> 32), lo = static_cast<uint32_t>(bits);
  const uint32_t min_hi = warp_min(hi);
  const unsigned at_hi = __ballot_sync(kFull, hi == min_hi);
  if (__popc(at_hi) == 1) return __ffs(at_hi) - 1;
  const uint32_t min_lo = warp_min(hi == min_hi ? lo : 0xFFFFFFFFu);
  const bool least = hi == min_hi && lo == min_lo;
  const unsigned at_least = __ballot_sync(kFull, least);
  if (__popc(at_least) == 1) return __ffs(at_least) - 1;
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

constexpr int kMaxWarps = 8;  // lsap_registers' largest block: 256 threads

// A warp's candidate for the step's column (its lanes' least in lsap::chosen_before's order), 16 bytes.
struct alignas(16) Candidate {
  double cost;      // the column's shortest-path cost
  uint32_t key;     // lsap::scan_key of the column
  uint32_t where;   // the column | (its row + 1) << 16 (columns and rows below 2^15 here)
};

// Shared memory of lsap_registers: two rounds of the warps' candidates (they alternate, so one barrier a step keeps
// them apart), the rows' duals and matches, the row each column was reached from (written only when a column's path
// gets shorter, read only along the augmenting path), the row matched to each column (written by the flip, read
// back into the threads' registers after it), then the cache of the rows read.
struct RowState {
  Candidate* candidates;  // (2, kMaxWarps)
  double* u;
  int32_t* col4row;
  int32_t* path;
  int32_t* row4col;
  char* cache;  // (cache_rows, nc) costs of type T, row by row
  __host__ __device__ static int64_t state_bytes(int64_t nr, int64_t nc) {
    return (2 * kMaxWarps * static_cast<int64_t>(sizeof(Candidate)) + 12 * nr + 8 * nc + 15) / 16 * 16;
  }
  __device__ static RowState at(char* base, int64_t nr, int64_t nc) {
    RowState s;
    s.candidates = reinterpret_cast<Candidate*>(base);
    s.u = reinterpret_cast<double*>(s.candidates + 2 * kMaxWarps);
    s.col4row = reinterpret_cast<int32_t*>(s.u + nr);
    s.path = s.col4row + nr;
    s.row4col = s.path + nc;
    s.cache = base + state_bytes(nr, nc);
    return s;
  }
};

// A thread's least (cost, key) over its L columns in lsap::chosen_before's order, by a tree (its depth log2 L, where
// a scan over the columns in turn is a chain of L - 1 comparisons), and the slot it came from.
template <int L>
__device__ __forceinline__ void thread_pick(double (&d)[L], uint32_t (&key)[L], double& best, uint32_t& best_key,
                                            int& best_slot) {
  int slot[L];
#pragma unroll
  for (int k = 0; k < L; ++k) slot[k] = k;
#pragma unroll
  for (int span = 1; span < L; span *= 2) {
#pragma unroll
    for (int k = 0; k + span < L; k += 2 * span) {
      if (lsap::chosen_before(d[k + span], key[k + span], d[k], key[k])) {
        d[k] = d[k + span];
        key[k] = key[k + span];
        slot[k] = slot[k + span];
      }
    }
  }
  best = d[0];
  best_key = key[0];
  best_slot = slot[0];
}

// One block of W warps solves one problem of up to 32 W L columns: thread x keeps columns x + 32 W k (k < L) in
// registers and picks its least by a tree. One warp (W = 1) needs no join: the warp's winner is read from its lane by
// shuffles, with no shared memory and no barrier a step. Several warps write their winners to shared memory, and every
// thread reads the W of them at once and joins them in a tree. A search reaches only row `cur` (its first step) and
// rows matched before it (rows < cur), and thread x only ever reads its own columns of a row: so row cur + 1 is loaded
// into registers while search cur runs (its latency hidden), and each thread keeps its columns of the first
// `cache_rows` rows in shared memory once it has read them (no barrier: no other thread reads them), so that a later
// step reads them there instead of from L1 or L2.
template <typename T, int W, int L>
__global__ void __launch_bounds__(W * kWarp)
    lsap_registers(const T* __restrict__ cost, const T* __restrict__ cost_t, int64_t R, int64_t C,
               const int64_t* __restrict__ sizes, int32_t cache_rows, const lsap::Result result,
               int32_t* __restrict__ info) {
  constexpr int threads = W * kWarp;
  extern __shared__ __align__(16) char smem[];
  const int64_t b = blockIdx.x;
  const int tid = threadIdx.x, lane = tid & (kWarp - 1), warp = tid / kWarp;
  const lsap::Result out = result.at(b);
  int64_t width;
  if (!start_problem(b, tid, threads, R, C, sizes, out, info, width)) return;
  const bool transposed = lsap::solved_transposed(R, width);
  const int32_t nr = static_cast<int32_t>(transposed ? width : R), nc = static_cast<int32_t>(transposed ? R : width);
  const Costs<T> at(cost, cost_t, b, R, C, transposed);
  const RowState s = RowState::at(smem, nr, nc);
  T* cache = reinterpret_cast<T*>(s.cache);
  const int32_t cached = min(cache_rows, nr);
  for (int32_t i = tid; i < nr; i += threads) {
    s.u[i] = 0;
    s.col4row[i] = -1;
  }
  for (int32_t t = tid; t < nc; t += threads) s.row4col[t] = -1;
  if (tid < 2 * kMaxWarps) s.candidates[tid] = Candidate{lsap::kInf, lsap::kNoColumn, 0};
  double v[L], spc[L];
  int32_t pos[L], match[L];
  T next[L];  // this thread's columns of row cur + 1, loaded during search cur
#pragma unroll
  for (int k = 0; k < L; ++k) {
    const int32_t t = tid + threads * k;
    v[k] = 0;
    match[k] = -1;
    next[k] = t < nc ? at.base[t * at.stride_t] : T(0);
  }
  __syncthreads();

  int32_t round = 0;
  for (int32_t cur = 0; cur < nr; ++cur) {
    T first[L];
    bool invalid = false;  // NaN or -inf among this thread's columns of row cur: offered at the search's first step
#pragma unroll
    for (int k = 0; k < L; ++k) {
      const int32_t t = tid + threads * k;
      first[k] = next[k];
      spc[k] = lsap::kInf;
      pos[k] = t < nc ? nc - 1 - t : kAbsent;
      if (t < nc) invalid |= lsap::invalid_entry(static_cast<double>(first[k]));
      if (cur < cached && t < nc) cache[static_cast<int64_t>(cur) * nc + t] = first[k];
    }
    if (cur + 1 < nr) {
      const T* row = at.base + (cur + 1) * at.stride_s;
#pragma unroll
      for (int k = 0; k < L; ++k) {
        const int32_t t = tid + threads * k;
        if (t < nc) next[k] = row[t * at.stride_t];
      }
    }
    double min_val = 0;
    int32_t i = cur, left = nc, sink = -1;
    while (sink < 0) {
      const double u_i = s.u[i];
      T c[L];
      if (i == cur) {
#pragma unroll
        for (int k = 0; k < L; ++k) c[k] = first[k];
      } else if (i < cached) {
        const T* row = cache + static_cast<int64_t>(i) * nc;
#pragma unroll
        for (int k = 0; k < L; ++k) c[k] = pos[k] >= 0 ? row[tid + threads * k] : T(0);
      } else {
        const T* row = at.base + i * at.stride_s;
#pragma unroll
        for (int k = 0; k < L; ++k) c[k] = pos[k] >= 0 ? row[(tid + threads * k) * at.stride_t] : T(0);
      }
      double d[L];
      uint32_t key[L];
#pragma unroll
      for (int k = 0; k < L; ++k) {
        d[k] = lsap::kInf;
        key[k] = lsap::kNoColumn;
        if (pos[k] < 0) continue;
        const double r = lsap::path_cost(min_val, static_cast<double>(c[k]), u_i, v[k]);
        if (r < spc[k]) {
          s.path[tid + threads * k] = i;
          spc[k] = r;
        }
        d[k] = spc[k];
        key[k] = lsap::scan_key(match[k] == -1, pos[k]);
      }
      double best;
      uint32_t best_key;
      int best_slot;
      thread_pick(d, key, best, best_key, best_slot);
      if (invalid) {  // only ever at a search's first step: the problem ends there
        best = -lsap::kInf;
        best_key = lsap::kInvalidKey;
      }
      const int winner = warp_winner(best, best_key);
      const uint32_t where =
          static_cast<uint32_t>(tid + threads * best_slot) | static_cast<uint32_t>(pick(match, best_slot) + 1) << 16;
      Candidate chosen;
      if constexpr (W == 1) {
        chosen = Candidate{__shfl_sync(kFull, best, winner), __shfl_sync(kFull, best_key, winner),
                           __shfl_sync(kFull, where, winner)};
      } else {
        Candidate* candidates = s.candidates + (round & 1) * kMaxWarps;
        if (lane == winner) candidates[warp] = Candidate{best, best_key, where};
        __syncthreads();
        Candidate x[W];
#pragma unroll
        for (int w = 0; w < W; ++w) x[w] = candidates[w];
#pragma unroll
        for (int span = 1; span < W; span *= 2) {
#pragma unroll
          for (int w = 0; w + span < W; w += 2 * span) {
            if (lsap::chosen_before(x[w + span].cost, x[w + span].key, x[w].cost, x[w].key)) x[w] = x[w + span];
          }
        }
        chosen = x[0];
        ++round;
      }
      min_val = chosen.cost;
      if (chosen.key == lsap::kInvalidKey) {  // row cur holds NaN or -inf
        if (tid == 0) info[b] = lsap::kInvalidEntry;
        return;
      }
      if (min_val == lsap::kInf) {  // every column left is out of reach
        const auto any = [](bool found) {
          if constexpr (W == 1) {
            return __any_sync(kFull, found) != 0;
          } else {
            return __syncthreads_or(found) != 0;
          }
        };
        const int32_t ended = unreachable_ends(at, cur, nr, nc, tid, threads, any);
        if (tid == 0) info[b] = ended;
        return;
      }
      const int32_t p = lsap::key_position(chosen.key);
      const int32_t column = static_cast<int32_t>(chosen.where & 0xFFFFu);
      const int32_t row = static_cast<int32_t>(chosen.where >> 16) - 1;
      --left;
#pragma unroll
      for (int k = 0; k < L; ++k) {
        if (pos[k] == left) pos[k] = p;
        if (tid + threads * k == column) pos[k] = kOnTree;
      }
      if (row == -1) {
        sink = column;
      } else {
        i = row;
      }
    }
    if (tid == 0) s.u[cur] += min_val;
#pragma unroll
    for (int k = 0; k < L; ++k) {
      if (pos[k] != kOnTree) continue;
      const double dual = min_val - spc[k];
      if (match[k] >= 0) s.u[match[k]] += dual;
      v[k] -= dual;
    }
    // one warp has had no barrier since its lanes wrote the path: publish it to the lane that flips it
    if constexpr (W == 1) __syncwarp();
    if (tid == 0) lsap::flip_path(s.path, s.row4col, s.col4row, cur, sink);
    __syncthreads();
#pragma unroll
    for (int k = 0; k < L; ++k) {
      const int32_t t = tid + threads * k;
      if (t < nc) match[k] = s.row4col[t];
    }
  }
  write_results(
      transposed, nr, nc, tid, threads, [&](int64_t i) { return s.col4row[i]; },
      [&](int64_t t) { return s.row4col[t]; }, out);
  if (tid == 0) info[b] = lsap::kSolved;
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
                                                      char* workspace, int64_t state_bytes, const lsap::Result result,
                                                      int32_t* __restrict__ info) {
  extern __shared__ __align__(16) char smem[];
  const int64_t b = blockIdx.x;
  const int lane = threadIdx.x;
  const lsap::Result out = result.at(b);
  int64_t width;
  if (!start_problem(b, lane, kWarp, R, C, sizes, out, info, width)) return;
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
      bool invalid = false;  // NaN or -inf in row cur, read whole at the search's first step
      for (int64_t t = lane; t < nc; t += kWarp) {
        const int32_t p = s.position[t];
        if (p < 0) continue;
        const double c = at(i, t);
        invalid |= i == cur && lsap::invalid_entry(c);
        const double r = lsap::path_cost(min_val, c, u_i, s.v[t]);
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
      if (invalid) {
        best = -lsap::kInf;
        best_key = lsap::kInvalidKey;
      }
      warp_choose(best, best_key);
      if (best_key == lsap::kInvalidKey) {
        if (lane == 0) info[b] = lsap::kInvalidEntry;
        return;
      }
      if (best == lsap::kInf) {  // every column left is out of reach
        const auto any = [](bool found) { return __any_sync(kFull, found) != 0; };
        const int32_t ended = unreachable_ends(at, cur, nr, nc, lane, kWarp, any);
        if (lane == 0) info[b] = ended;
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
    if (lane == 0) lsap::flip_path(s.path, s.row4col, s.col4row, cur, sink);
    __syncwarp();
  }
  write_results(
      transposed, nr, nc, lane, kWarp, [&](int64_t i) { return s.col4row[i]; },
      [&](int64_t t) { return s.row4col[t]; }, out);
  if (lane == 0) info[b] = lsap::kSolved;
}

// lsap_registers' warps for a problem of nc columns (at most 1,024): the fewest of 1, 2, 4 and 8 that give each thread
// at most 3 columns, and 8 above 768 columns (4 a thread). Measured on an H100 (docs/performance.md, "Hungarian
// matching"): at 300 columns 4 warps (3 a thread) beat 1, 2 and 8, and at 600 columns 8 warps beat 4.
constexpr int kMaxColumnsPerThread = 4;
int registers_warps(int64_t nc) {
  for (int warps = 1; warps < kMaxWarps; warps *= 2) {
    if (nc <= 3 * kWarp * warps) return warps;
  }
  return kMaxWarps;
}

// lsap_registers<T, W, l> for an l known at run time, handed to `launch`: l from L (1 for one warp, else 2: more warps
// come only past 3 columns a thread) up to Last (3, and kMaxColumnsPerThread for 8 warps), the kernels
// registers_warps can choose.
template <typename T, int W, int L = W == 1 ? 1 : 2, typename Launch>
void launch_registers(int64_t l, const Launch& launch) {
  constexpr int Last = W == kMaxWarps ? kMaxColumnsPerThread : 3;
  if constexpr (L < Last) {
    if (l > L) return launch_registers<T, W, L + 1>(l, launch);
  }
  launch(lsap_registers<T, W, L>);
}

void solve_cuda(const LsapDims& d, const at::Tensor& cost, const std::optional<at::Tensor>& sizes,
                const lsap::Result& out, at::Tensor& info) {
  const c10::cuda::CUDAGuard guard(cost.device());
  TORCH_CHECK_VALUE(d.B <= std::numeric_limits<int32_t>::max(), "cost: at most 2^31 - 1 problems, got ", d.B);
  const auto c = cost.contiguous();
  // sizes on the CPU were checked by check_linear_sum_assignment_args; their copy does not wait for the GPU
  const auto n = sizes.has_value() ? sizes->to(cost.device(), at::kLong, /*non_blocking=*/true) : at::Tensor();
  const int64_t nr = d.K, nc = std::max(d.R, d.C);
  const auto stream = at::cuda::getCurrentCUDAStream();
  const auto* props = at::cuda::getCurrentDeviceProperties();
  const int64_t* n_ptr = n.defined() ? n.data_ptr<int64_t>() : nullptr;
  // up to 1,024 columns, lsap_registers: W warps with up to L columns a thread (registers_warps), and the rows it
  // reads kept in shared memory where they fit: what the SM holds, shared by the blocks that must run on it at once
  const int warps = registers_warps(nc);
  const int64_t per_thread = std::max<int64_t>(1, (nc + kWarp * warps - 1) / (kWarp * warps));
  const bool in_registers = per_thread <= kMaxColumnsPerThread;
  const int64_t per_sm = (d.B + props->multiProcessorCount - 1) / props->multiProcessorCount;
  const int64_t room = std::min<int64_t>(props->sharedMemPerBlockOptin,
                                         static_cast<int64_t>(props->sharedMemPerMultiprocessor) / per_sm -
                                             static_cast<int64_t>(props->reservedSharedMemPerBlock));
  const int64_t state = RowState::state_bytes(nr, nc), row_bytes = nc * static_cast<int64_t>(c.element_size());
  const int64_t cache_rows = row_bytes > 0 ? std::clamp<int64_t>((room - state) / row_bytes, 0, nr) : 0;
  // tall problems are solved transposed: a transposed copy makes each of their rows contiguous, unless every row
  // goes to the cache at its first read (strided reads then happen once a row, ahead of the search that needs it)
  const bool some_tall = d.R > 1 && (sizes.has_value() || d.C < d.R);
  const bool all_cached = in_registers && cache_rows >= nr;
  const auto ct = some_tall && !all_cached ? c.transpose(-1, -2).contiguous() : at::Tensor();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, c.scalar_type(), "linear_sum_assignment_cuda", [&] {
    using T = scalar_t;
    const T* c_ptr = c.data_ptr<T>();
    const T* ct_ptr = ct.defined() ? ct.data_ptr<T>() : nullptr;
    if (in_registers) {
      const int64_t smem = state + cache_rows * row_bytes;
      const auto launch = [&](auto kernel) {
        if (smem > 48 * 1024) raise_smem_limit(kernel, smem);
        kernel<<<static_cast<unsigned>(d.B), static_cast<unsigned>(kWarp * warps), static_cast<size_t>(smem),
                 stream>>>(c_ptr, ct_ptr, d.R, d.C, n_ptr, static_cast<int32_t>(cache_rows), out,
                           info.data_ptr<int32_t>());
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      };
      if (warps == 1) return launch_registers<T, 1>(per_thread, launch);
      if (warps == 2) return launch_registers<T, 2>(per_thread, launch);
      if (warps == 4) return launch_registers<T, 4>(per_thread, launch);
      return launch_registers<T, 8>(per_thread, launch);
    }
    // wider problems: the state in shared memory, or in a global workspace when too large for it
    const int64_t state_bytes = State::bytes(nr, nc);
    const bool in_smem = state_bytes <= props->sharedMemPerBlockOptin;
    const auto workspace = in_smem ? at::Tensor() : at::empty({d.B * state_bytes}, cost.options().dtype(at::kByte));
    const auto kernel = lsap_memory<T>;
    const int64_t smem = in_smem ? state_bytes : 0;
    if (smem > 48 * 1024) raise_smem_limit(kernel, smem);
    kernel<<<static_cast<unsigned>(d.B), kWarp, static_cast<size_t>(smem), stream>>>(
        c_ptr, ct_ptr, d.R, d.C, n_ptr, in_smem ? nullptr : static_cast<char*>(workspace.data_ptr()), state_bytes,
        out, info.data_ptr<int32_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(lucid, CUDA, m) { LsapEntry<solve_cuda>::register_in(m); }

}  // namespace gpu
}  // namespace lucid
