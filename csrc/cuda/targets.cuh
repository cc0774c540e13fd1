// Step 6 on the GPU: the outputs of the fused assignment, from the owners and the row maxima (rules.h).
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/problem.cuh"

namespace lucid {
namespace gpu {

// The outputs, a block per kThreads consecutive anchors of the (B, A) grid: per anchor its target label, index, box
// and normalised metric (background anchors take row 0), and whether each image the block touches is poisoned
// (rules::row_poisoned; only images with a flagged row need their rows read); then the block's stretches of the
// boxes and of the scores (one-hot * norm), each written in order, 16 bytes at a time.
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
  static_assert(std::is_same<T, float>::value, "the scores and boxes are written as float4");
  __shared__ int s_poisoned[kThreads];  // per image the block touches, from the first
  __shared__ int64_t s_label[kThreads];
  __shared__ T s_norm[kThreads];
  __shared__ bool s_fg[kThreads];
  __shared__ __align__(16) T s_box[kThreads * 5];
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * kThreads;
  const int64_t left = o.B * o.A - i0;
  const int n_here = left < kThreads ? static_cast<int>(left) : kThreads;
  const int64_t b0 = i0 / o.A, b1 = (i0 + n_here - 1) / o.A;  // at most kThreads images
  // the anchor's outputs that do not depend on the images' poisoning first, so that their loads overlap its check
  const int64_t i = i0 + threadIdx.x;
  const int64_t b = i / o.A;
  bool fg = false;
  int64_t row = 0;
  T norm = T(0);
  if (threadIdx.x < n_here) {
    int64_t m = o.owner[i];
    if (m >= 0 && o.keep != nullptr && !o.keep[i]) m = -1;
    fg = m >= 0;
    const int64_t idx = rules::target_row(m);
    row = b * o.M + idx;
    o.out_fg[i] = fg;
    o.out_idx[i] = idx;
    const int64_t label = rules::target_label(o.labels[row]);
    o.out_labels[i] = label;
    s_label[threadIdx.x] = label;
    s_fg[threadIdx.x] = fg;
    for (int d = 0; d < o.D; ++d) s_box[threadIdx.x * o.D + d] = o.gt[row * o.D + d];
    if (fg) {
      // maxima over the row: the owned anchors, and 0 from the others when the row does not own all A
      const bool owns_all = o.stats.owned[row] >= o.A;
      const T pa = rules::row_max(static_cast<T>(rules::key_value(o.stats.best_align[row])), owns_all);
      const T po = rules::row_max(static_cast<T>(rules::key_value(o.stats.best_ov[row])), owns_all);
      norm = rules::normalised(o.own_align[i], pa, po, o.eps, o.M > 1);
    }
  }
  for (int64_t bb = b0; bb <= b1; ++bb) {
    int poisoned = 0;
    if (o.notes.img_flag[bb]) {  // the same in all threads
      int mine = 0;
      for (int64_t r = bb * o.M + threadIdx.x; r < (bb + 1) * o.M; r += kThreads) {
        mine |= rules::row_poisoned(o.notes.nan_seen[r] != 0, o.notes.inf_cand[r], o.stats.inf_owned[r]);
      }
      poisoned = __syncthreads_or(mine);
    }
    if (threadIdx.x == 0) s_poisoned[bb - b0] = poisoned;
  }
  __syncthreads();
  if (threadIdx.x < n_here) {
    if (s_poisoned[b - b0]) norm = rules::poisoned_norm<T>();
    s_norm[threadIdx.x] = norm;
  }
  __syncthreads();
  // the block's stretch of n_here * D boxes, four floats at a time (it starts at a multiple of kThreads * D floats,
  // so at 16 bytes when the array does)
  {
    const int n_box = n_here * o.D;
    T* boxes = o.out_boxes + i0 * o.D;
    const int n4 = reinterpret_cast<uintptr_t>(boxes) % sizeof(float4) == 0 ? n_box / 4 : 0;
    for (int j = threadIdx.x; j < n4; j += kThreads) {
      reinterpret_cast<float4*>(boxes)[j] = reinterpret_cast<const float4*>(s_box)[j];
    }
    for (int j = n4 * 4 + threadIdx.x; j < n_box; j += kThreads) boxes[j] = s_box[j];
  }
  // I: the index type within the block's stretch of n_here * C scores, written four at a time (the stretch starts
  // at a multiple of kThreads * C floats, so at 16 bytes when the array does)
  const I C = static_cast<I>(o.C), total = static_cast<I>(n_here) * C;
  T* scores = o.out_scores + i0 * o.C;
  auto score = [&](I li, I c) {
    return rules::class_score(s_fg[li], s_label[li] == c, s_norm[li]);
  };
  const bool vec = reinterpret_cast<uintptr_t>(scores) % sizeof(float4) == 0;
  const I n4 = vec ? total / 4 : 0;
  for (I j4 = threadIdx.x; j4 < n4; j4 += kThreads) {
    I li = j4 * 4 / C, c = j4 * 4 - li * C;
    float v[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      v[q] = score(li, c);
      if (++c == C) c = 0, ++li;
    }
    reinterpret_cast<float4*>(scores)[j4] = make_float4(v[0], v[1], v[2], v[3]);
  }
  for (I j = n4 * 4 + threadIdx.x; j < total; j += kThreads) scores[j] = score(j / C, j % C);
}

}  // namespace gpu
}  // namespace lucid
