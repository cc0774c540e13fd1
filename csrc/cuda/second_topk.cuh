// Step 5 on the GPU (only when K2 != K): each row keeps the K2 best of the anchors it owns after step 4, with the
// zero fill, ranked as in step 3 (block_select.cuh).
#pragma once

#include <cub/block/block_reduce.cuh>

#include <cstdint>

#include "cuda/block_select.cuh"
#include "cuda/problem.cuh"

namespace lucid {
namespace gpu {

// Source over the anchors a row owns. With `P` (a row with non-finite metrics), the row's other candidates whose
// metric is not finite take part too, as NaN (rules::unowned_stand_in).
template <typename S, typename T>
struct OwnedSource {
  const int64_t* owner;  // (A) of this image
  const T* own_align;
  const T* own_ov;
  int64_t m, A;
  const Problem<S, T>* P;  // null unless the row has non-finite metrics
  int64_t row, b;
  __device__ int64_t size() const { return A; }
  __device__ bool get(int64_t a, KeyedEntry<T>& e) const {
    if (owner[a] == m) {
      e = {{own_align[a], own_ov[a], static_cast<int32_t>(a)}, order_key(own_align[a])};
      return true;
    }
    if (P == nullptr || !P->candidate(row, a)) return false;
    const KeyedEntry<T> full = P->entry(row, b, a);
    const T v = rules::unowned_stand_in(full.align);
    if (!geom::isnan_(v)) return false;
    e = {{v, full.overlap, static_cast<int32_t>(a)}, order_key(v)};
    return true;
  }
};

// The selection works from the lists of owned anchors step 4 made: second_topk_short_rows_kernel ranks the lists of
// rows that own at most kOwnCap anchors and have only finite metrics, a warp each, and passes the other rows to
// second_topk_scan_rows_kernel, which scans all A anchors per row. The survivors are marked in `keep` and go into the
// row statistics; the owner array is left as it is (the targets kernel reads `keep`), so no row's scan sees another
// row's result.
template <typename S, typename T>
__global__ void __launch_bounds__(kThreads)
    second_topk_short_rows_kernel(Problem<S, T> P, RowNotes notes, const int32_t* own_n, const int32_t* own_list,
                                  const T* own_align, const T* own_ov, int k2, int32_t* keep, RowStats stats,
                                  int32_t* slow_rows, int32_t* slow_n) {
  __shared__ uint32_t s_key[kWarps][kOwnCap];
  __shared__ int32_t s_anchor[kWarps][kOwnCap];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (row >= P.B * P.M) return;  // whole warps
  const int n = own_n[row];
  if (n == 0) return;
  if (n > kOwnCap || notes.flagged(row)) {
    if (lane == 0) slow_rows[atomicAdd(slow_n, 1)] = static_cast<int32_t>(row);
    return;
  }
  const int64_t b = row / P.M;
  const bool has = lane < n;
  int32_t anchor[1] = {has ? own_list[row * kOwnCap + lane] : 0};
  const int64_t p = b * P.A + anchor[0];
  uint32_t key[1] = {has ? order_key(own_align[p]) : 0u};
  s_key[warp][lane] = key[0];
  s_anchor[warp][lane] = anchor[0];
  __syncwarp();
  int64_t rank[1];
  list_ranks<1>(key, anchor, s_key[warp], s_anchor[warp], n, P.A, rank);
  if (has && rank[0] < k2) {
    keep[p] = 1;
    stats.add(row, own_align[p], own_ov[p]);
  }
}

template <typename S, typename T>
__global__ void __launch_bounds__(kThreads)
    second_topk_scan_rows_kernel(Problem<S, T> P, RowNotes notes, const int64_t* owner, const T* own_align,
                                 const T* own_ov, int k2, int32_t* keep, RowStats stats, const int32_t* rows,
                                 const int32_t* n_rows) {
  const int64_t M = P.M, A = P.A;
  __shared__ RadixState sh;
  __shared__ typename BlockScan::TempStorage scan_tmp;
  __shared__ typename BlockReduce::TempStorage reduce_tmp;
  __shared__ int n_explicit;
  const int n_list = *n_rows;
  for (int i = blockIdx.x; i < n_list; i += gridDim.x) {
    const int64_t row = rows[i];
    const int64_t b = row / M, m = row % M;
    const int64_t* own = owner + b * A;
    const bool flagged = notes.flagged(row);
    OwnedSource<S, T> src{own, own_align + b * A, own_ov + b * A, m, A, flagged ? &P : nullptr, row, b};
    // the explicit entries: the owned anchors, and for a flagged row its candidates with non-finite metrics
    int mine = 0;
    for (int64_t a = threadIdx.x; a < A; a += blockDim.x) {
      KeyedEntry<T> e;
      mine += src.get(a, e);
    }
    const int all = BlockReduce(reduce_tmp).Sum(mine);
    if (threadIdx.x == 0) n_explicit = all;
    __syncthreads();
    // survivors: only anchors the row owns (the others take places without being kept)
    select_row<kThreads, T>(src, n_explicit, A, k2, sh, scan_tmp, [&](const KeyedEntry<T>& e) {
      if (own[e.anchor] == m) {
        keep[b * A + e.anchor] = 1;
        stats.add(row, e.align, e.overlap);
      }
    });
    __syncthreads();  // shared memory is reused by the next row
  }
}

}  // namespace gpu
}  // namespace lucid
