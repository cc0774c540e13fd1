// Step 2 on the GPU, overlap and metric: the per-box values of the overlaps, computed once per box with CUDA's math
// library as the reference on the device (CIoU: atan of the aspect ratio; probiou: the Gaussian, dividing by 12 as
// PyTorch does on the device), and the clamped overlap of a pair from them (geometry.h). The metric is
// rules::align_metric. Used by the ops pair_overlaps and box_metrics and by the fused assignment.
#pragma once

#include <cstdint>

#include "geometry.h"

namespace lucid {
namespace gpu {

// Values per box: 1 for an axis-aligned box, 3 for an oriented one (kBoxValues slots are kept for either).
constexpr int kBoxValues = 3;

// The values of box `box` (D = 4 or 5) into out; cos_t and sin_t are those of its angle (D = 5 only).
template <typename T>
__device__ __forceinline__ void box_values(const T* box, int D, T cos_t, T sin_t, T* out) {
  if (D == 4) {
    out[0] = ::atan(geom::ciou_aspect(box[0], box[1], box[2], box[3]));
  } else {
    const auto g = geom::gaussian<T, /*kReciprocal=*/true>(box[2], box[3], cos_t, sin_t);
    out[0] = g.a;
    out[1] = g.b;
    out[2] = g.c;
  }
}

// The overlap of object box g and predicted box q (D values each) from their box values, clamped below at 0.
template <typename T>
__device__ __forceinline__ T pair_overlap(const T* g, const T* gv, const T* q, const T* qv, int D,
                                          bool classic_ciou = false) {
  T o;
  if (D == 4) {
    o = geom::ciou<T>(g[0], g[1], g[2], g[3], q[0], q[1], q[2], q[3], gv[0], qv[0], classic_ciou);
  } else {
    o = geom::probiou<T>(g[0], g[1], {gv[0], gv[1], gv[2]}, q[0], q[1], {qv[0], qv[1], qv[2]});
  }
  return geom::clamp_min(o, T(0));
}

// The overlap of two boxes given alone (the ops): their values first, then pair_overlap.
template <typename T>
__device__ __forceinline__ T overlap_of(const T* g, const T* q, int D) {
  T gv[kBoxValues], qv[kBoxValues];
  const bool rotated = D == 5;
  box_values(g, D, rotated ? ::cos(g[4]) : T(0), rotated ? ::sin(g[4]) : T(0), gv);
  box_values(q, D, rotated ? ::cos(q[4]) : T(0), rotated ? ::sin(q[4]) : T(0), qv);
  return pair_overlap(g, gv, q, qv, D);
}

}  // namespace gpu
}  // namespace lucid
