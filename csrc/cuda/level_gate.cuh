// Step 1 of the pose assignment on the GPU, the level gate (docs/spec.md, "Pose"): what prepare_kernel adds for it
// (the anchors' strides and their extremes, per row its side, OKS scale and visible keypoints), and
// level_gate_kernel, which decides per row whether the gate applies: whether some anchor inside the row's region
// passes it. The row kernels of steps 1-3 then test anchors with the row's RowGate.
#pragma once

#include <c10/macros/Macros.h>

#include <cstdint>

#include "cuda/anchor_index.cuh"
#include "cuda/keypoints.cuh"
#include "cuda/problem.cuh"

namespace lucid {
namespace gpu {

// Block 0 of prepare_kernel (kPrepThreads threads), after the anchor index: the strides as float32, and the smallest
// and largest of them (NaN when one is NaN, as torch.min and torch.max give).
__device__ void prepare_strides(const void* in, at::ScalarType type, int64_t A, float* stride, float* extremes) {
  constexpr int kWarpsHere = kPrepThreads / 32;
  __shared__ float part[2][kWarpsHere];
  float lo = INFINITY, hi = -INFINITY;
  bool nan = false;
  for (int64_t a = threadIdx.x; a < A; a += blockDim.x) {
    const float t = load_stride(in, type, a);
    stride[a] = t;
    nan |= t != t;
    lo = fminf(lo, t);
    hi = fmaxf(hi, t);
  }
  nan = __syncthreads_or(nan);
  lo = warp_min_f(lo), hi = warp_max_f(hi);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) part[0][warp] = lo, part[1][warp] = hi;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kWarpsHere; ++w) lo = fminf(lo, part[0][w]), hi = fmaxf(hi, part[1][w]);
    extremes[0] = nan ? NAN : lo;
    extremes[1] = nan ? NAN : hi;
  }
}

// The pose values of object row j from its box x1y1x2y2 (as given): side and OKS scale, and its visible keypoints.
__device__ __forceinline__ void prepare_pose_row(const PoseView& pose, const float* box, int64_t j, float eps) {
  const float area = geom::box_area(box[0], box[1], box[2], box[3]);
  int n = 0;
  for (int k = 0; k < pose.K; ++k) n += pose.gt_kpts[(j * pose.K + k) * 3 + 2] > 0.0f;
  pose.rows[j] = PoseRow{geom::sqrt_(geom::clamp_min(area, 0.0f)), geom::oks_scale(area, eps), n, 0};
}

// A warp per real object row: gated = some anchor inside the row's candidate region passes its level gate (the walk
// stops at the first). Rows without a usable cell range (non-finite boxes or anchors) test every anchor.
template <typename S, typename T>
__global__ void __launch_bounds__(kThreads) level_gate_kernel(Problem<S, T> P, CellIndex cells) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (row >= P.B * P.M || !P.valid[row]) return;  // whole warps; padding rows are never tested
  const RowGate gate = P.pose.gate(row, /*decided=*/false);
  bool found = false;
  CellRange range;
  if (cells_under(P.prep.regions, row, P.D, cells, range)) {
    const RegionOf<T> region = P.prep.regions.of(row, P.D);
    walk_cells(
        cells, range, 0, 1, [&](int32_t a) { return region.contains(P.point(a)) && gate.passes(a); },
        [&](int32_t, bool in) {
          found = __any_sync(0xffffffffu, in);
          return !found;
        });
  } else {
    for (int64_t a0 = 0; a0 < P.A && !found; a0 += 32) {
      const int64_t a = a0 + lane;
      found = __any_sync(0xffffffffu, a < P.A && P.prep.regions.contains(row, P.D, P.point(a).x, P.point(a).y) &&
                                          gate.passes(a));
    }
  }
  if (lane == 0) P.pose.rows[row].gated = found;
}

}  // namespace gpu
}  // namespace lucid
