// Step 6 on the GPU: the outputs of the fused assignment, from the owners and the row maxima (rules.h).
#pragma once

#include <cstdint>

#include "cuda/problem.cuh"

namespace lucid {
namespace gpu {

// The outputs, a block per kThreads consecutive anchors of the (B, A) grid: first whether each image the block
// touches is poisoned (rules::row_poisoned; only images with a flagged row need their rows read), then per anchor its
// target label, box, index and normalised metric (background anchors take row 0), then the block's stretch of the
// scores, written in order: one-hot * norm.
template <typename T>
struct TargetArgs {
  const int64_t* owner;
  const int32_t* keep;  // the second top-k's survivors, or null
  const T* own_align;
  RowStats stats;
  RowNotes notes;
  const int64_t* labels;
  const T* gt;
  int64_t B, M, A, C;
  int D;
  T eps;
  int64_t* out_labels;
  T* out_boxes;
  T* out_scores;
  bool* out_fg;
  int64_t* out_idx;
};

template <typename T, typename I>
__global__ void __launch_bounds__(kThreads) targets_kernel(const TargetArgs<T> o) {
  __shared__ int s_poisoned[kThreads];  // per image the block touches, from the first
  __shared__ int64_t s_label[kThreads];
  __shared__ T s_norm[kThreads];
  __shared__ bool s_fg[kThreads];
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * kThreads;
  const int64_t left = o.B * o.A - i0;
  const int n_here = left < kThreads ? static_cast<int>(left) : kThreads;
  const int64_t b0 = i0 / o.A, b1 = (i0 + n_here - 1) / o.A;  // at most kThreads images
  for (int64_t b = b0; b <= b1; ++b) {
    int poisoned = 0;
    if (o.notes.img_flag[b]) {  // the same in all threads
      int mine = 0;
      for (int64_t row = b * o.M + threadIdx.x; row < (b + 1) * o.M; row += kThreads) {
        mine |= rules::row_poisoned(o.notes.nan_seen[row] != 0, o.notes.inf_cand[row], o.stats.inf_owned[row]);
      }
      poisoned = __syncthreads_or(mine);
    }
    if (threadIdx.x == 0) s_poisoned[b - b0] = poisoned;
  }
  __syncthreads();
  if (threadIdx.x < n_here) {
    const int64_t i = i0 + threadIdx.x;
    const int64_t b = i / o.A;
    int64_t m = o.owner[i];
    if (m >= 0 && o.keep != nullptr && !o.keep[i]) m = -1;
    const bool fg = m >= 0;
    const int64_t idx = fg ? m : 0;
    const int64_t row = b * o.M + idx;
    o.out_fg[i] = fg;
    o.out_idx[i] = idx;
    const int64_t label = o.labels[row] < 0 ? 0 : o.labels[row];
    o.out_labels[i] = label;
    for (int d = 0; d < o.D; ++d) o.out_boxes[i * o.D + d] = o.gt[row * o.D + d];
    T norm = T(0);
    if (s_poisoned[b - b0]) {
      norm = __int_as_float(0x7fc00000);
    } else if (fg) {
      // maxima over the row: the owned anchors, and 0 from the others when the row does not own all A
      const bool owns_all = o.stats.owned[row] >= o.A;
      const T pa = rules::row_max(static_cast<T>(key_to_float(o.stats.best_align[row])), owns_all);
      const T po = rules::row_max(static_cast<T>(key_to_float(o.stats.best_ov[row])), owns_all);
      norm = rules::normalised(o.own_align[i], pa, po, o.eps, o.M > 1);
    }
    s_label[threadIdx.x] = label;
    s_norm[threadIdx.x] = norm;
    s_fg[threadIdx.x] = fg;
  }
  __syncthreads();
  // I: the index type within the block's stretch of n_here * C scores
  const I C = static_cast<I>(o.C), total = static_cast<I>(n_here) * C;
  T* scores = o.out_scores + i0 * o.C;
  for (I j = threadIdx.x; j < total; j += kThreads) {
    const I li = j / C, c = j % C;
    scores[j] = (s_fg[li] && s_label[li] == c) ? s_norm[li] : rules::off_label_score(s_norm[li]);
  }
}

}  // namespace gpu
}  // namespace lucid
