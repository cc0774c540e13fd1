// Step 4 on the GPU, in the fused assignment: every anchor gets its owner. An anchor claimed once goes to its
// claimant; an anchor claimed more than once to the first row with the largest overlap over all M rows (rules::
// FirstMax, as the dense op resolve_conflicts.cu), recomputed.
#pragma once

#include <cstdint>

#include "cuda/problem.cuh"

namespace lucid {
namespace gpu {

// (The claims were counted per anchor as step 3 made them.) One thread per anchor: an anchor claimed once takes its
// claimant; an anchor claimed several times is appended to `conflicts` for conflict_owners_kernel.
template <typename T>
__global__ void owners_from_claims_kernel(int64_t n, int64_t A, int64_t M, int k, const int32_t* count,
                                          const unsigned long long* claimant, const T* claim_align,
                                          const T* claim_ov, OwnerSink sink, int64_t* owner, T* own_align,
                                          T* own_ov, int64_t* conflicts, unsigned long long* n_conf) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int c = count[i];
  if (c == 0) {
    owner[i] = -1;
    own_align[i] = T(0);
    own_ov[i] = T(0);
  } else if (c == 1) {
    const int64_t slot = static_cast<int64_t>(claimant[i]);
    const int64_t row = slot / k;
    owner[i] = row - (i / A) * M;
    own_align[i] = claim_align[slot];
    own_ov[i] = claim_ov[slot];
    sink.add(row, i % A, own_align[i], own_ov[i]);
  } else {
    conflicts[atomicAdd(n_conf, 1ull)] = i;
  }
}

// One warp per conflicted anchor (warps take anchors from the list in turn): the M rows are shared by the lanes,
// and the first maximum of the overlap over all M rows (rules::FirstMax; rows where the anchor is not a candidate
// count 0) is found by a warp reduction. Each anchor's result is written by its own warp, so the order of the list
// does not matter.
template <typename S, typename T>
__global__ void conflict_owners_kernel(Problem<S, T> P, const int64_t* conflicts, const int64_t* n_conf,
                                       OwnerSink sink, int64_t* owner, T* own_align, T* own_ov) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  const int64_t n = *n_conf;
  for (int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; w < n; w += warps) {
    const int64_t i = conflicts[w];
    const int64_t b = i / P.A, a = i % P.A;
    // each lane: the first maximum over its rows m = lane, lane + 32, ...
    rules::FirstMax<T> best;
    for (int64_t m = lane; m < P.M; m += 32) {
      const int64_t row = b * P.M + m;
      best.offer(P.candidate(row, a) ? P.overlap(row, i) : T(0), m);
    }
    // then over the lanes
    for (int o = 16; o > 0; o >>= 1) {
      const int64_t other = __shfl_down_sync(0xffffffffu, best.index, o);
      const T other_v = __shfl_down_sync(0xffffffffu, best.value, o);
      if (other >= 0) best.offer(other_v, other);
    }
    const int64_t best_m = best.index;
    const T best_v = best.value;
    if (lane == 0) {
      const int64_t row = b * P.M + best_m;
      owner[i] = best_m;
      own_ov[i] = best_v;
      own_align[i] = P.candidate(row, a) ? P.align(row, i, best_v) : T(0);
      sink.add(row, a, own_align[i], best_v);
    }
  }
}

}  // namespace gpu
}  // namespace lucid
