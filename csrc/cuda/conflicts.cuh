// Step 4 on the GPU, in the fused assignment: every anchor gets its owner. An anchor claimed once goes to its
// claimant; an anchor claimed more than once to the first row with the largest overlap over all M rows (rules::
// FirstMax, as the dense op resolve_conflicts.cu), which step 3 found as it computed the candidate pairs (FirstRows
// in problem.cuh): no anchor scans the rows.
#pragma once

#include <cstdint>

#include "cuda/problem.cuh"

namespace lucid {
namespace gpu {

// One thread per anchor p = b*A + a: its owner m (-1: background) and that pair's metric and overlap, computed again
// (the same function as step 3, so the same values), and the owner's statistics or list (OwnerSink).
template <typename S, typename T>
__global__ void __launch_bounds__(kThreads)
    owners_kernel(Problem<S, T> P, Claims claims, FirstRows first, OwnerSink sink, int64_t* owner, T* own_align,
                  T* own_ov) {
  const int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p >= P.B * P.A) return;
  const int c = claims.count[p];
  if (c == 0) {
    owner[p] = -1;
    own_align[p] = T(0);
    own_ov[p] = T(0);
    return;
  }
  const int64_t b = p / P.A, a = p % P.A;
  const int64_t m = c == 1 ? claims.claimant[p] - b * P.M : first.first_row(p);
  const int64_t row = b * P.M + m;
  // a claimant, and a row that offered the largest overlap, are candidates; row 0 of an all-zero anchor may not be
  const bool cand = c == 1 || P.candidate(row, a);
  const T ov = cand ? P.overlap(row, p) : T(0);
  const T al = cand ? P.align(row, p, ov) : T(0);
  owner[p] = m;
  own_align[p] = al;
  own_ov[p] = ov;
  sink.add(row, a, al, ov);
}

}  // namespace gpu
}  // namespace lucid
