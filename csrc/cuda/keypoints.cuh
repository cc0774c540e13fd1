// Pose on the GPU (docs/spec.md, "Pose"): what the level gate of step 1 and the keypoint OKS of step 2 read
// (PoseView), the per-row values prepare_kernel computes for them (PoseRow), and the OKS of one pair (geometry.h, with
// CUDA's expf and sqrtf, as the reference on the device).
#pragma once

#include <ATen/core/ScalarType.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

#include "geometry.h"

namespace lucid {
namespace gpu {

// Per object row: the side of the level gate (sqrt(max(w*h, 0))), the OKS scale (w*h*0.53 + eps), the visible
// keypoints, and whether the gate applies (an anchor inside the row's region passes it: level_gate_kernel).
struct PoseRow {
  float side;
  float scale;
  int32_t n_visible;
  int32_t gated;
};

// A (..., 2) float tensor of any floating dtype read as float32 pairs, as PyTorch's .float() rounds it.
struct Float2In {
  const void* p;
  at::ScalarType type;
  __device__ float2 load(int64_t i) const {
    switch (type) {
      case at::kHalf: {
        const auto* h = static_cast<const c10::Half*>(p);
        return make_float2(static_cast<float>(h[2 * i]), static_cast<float>(h[2 * i + 1]));
      }
      case at::kBFloat16: {
        const auto* h = static_cast<const c10::BFloat16*>(p);
        return make_float2(static_cast<float>(h[2 * i]), static_cast<float>(h[2 * i + 1]));
      }
      case at::kDouble: {
        const auto* d = static_cast<const double*>(p);
        return make_float2(static_cast<float>(d[2 * i]), static_cast<float>(d[2 * i + 1]));
      }
      default:
        return reinterpret_cast<const float2*>(p)[i];
    }
  }
};

// A float value rounded to the strides' dtype (float32 strides: unchanged), as a product of a tensor of that dtype
// and a number is rounded by PyTorch.
__device__ __forceinline__ float round_to(at::ScalarType type, float v) {
  if (type == at::kHalf) return static_cast<float>(c10::Half(v));
  if (type == at::kBFloat16) return static_cast<float>(c10::BFloat16(v));
  return v;
}

// The strides of the anchors (float32, float16 or bfloat16), read as float32 (exact).
__device__ __forceinline__ float load_stride(const void* p, at::ScalarType type, int64_t a) {
  if (type == at::kHalf) return static_cast<float>(static_cast<const c10::Half*>(p)[a]);
  if (type == at::kBFloat16) return static_cast<float>(static_cast<const c10::BFloat16*>(p)[a]);
  return static_cast<const float*>(p)[a];
}

// The level gate as one row applies it to the anchors it visits (inactive for boxes, and for a row the gate would
// leave without candidates): its side, and what the bounds of an anchor's stride need, in registers.
struct RowGate {
  bool active;
  float side;
  const float* stride;
  float smallest, largest, lo, hi;
  at::ScalarType type;
  // anchor a passes the level gate of the row
  __device__ bool passes(int64_t a) const {
    const float t = __ldg(stride + a);
    const float lo_t = round_to(type, geom::mul(t, lo)), hi_t = round_to(type, geom::mul(t, hi));
    return geom::level_pass(side, lo_t, hi_t, t == smallest, t == largest);
  }
  __device__ bool allows(int64_t a) const { return !active || passes(a); }
};

// What the pose passes read. `on` is false for the box assignment (every other field unused).
struct PoseView {
  bool on;
  int K;
  float lo, hi;                // the level range
  at::ScalarType stride_type;  // the dtype of the strides, to which lo * t and hi * t are rounded
  const float* stride;         // (A) the anchors' strides as float32 (written by prepare_kernel)
  const float* extremes;       // (2) the smallest and largest stride (NaN when a stride is NaN)
  PoseRow* rows;               // (B*M)
  const float* gt_kpts;        // (B*M, K, 3) x, y, visibility
  Float2In pd_kpts;            // (B*A, K, 2)
  const float* sigmas;         // (K)
  bool mean = false;           // rule set 8.4.180 (geometry.h RuleSet): no level gate, overlap mean2(box, OKS)

  // The gate of `row`; `decided`: whether it applies is known (level_gate_kernel has run), else it is taken to apply.
  __device__ RowGate gate(int64_t row, bool decided = true) const {
    if (!on || mean) return RowGate{false, 0.0f, nullptr, 0.0f, 0.0f, 0.0f, 0.0f, stride_type};
    return RowGate{!decided || rows[row].gated != 0, rows[row].side, stride, extremes[0], extremes[1], lo, hi,
                   stride_type};
  }

  // Step 2's overlap of object `row` and prediction p = b*A + a when the object has a visible keypoint: the mean of
  // the visible keypoints' terms, summed in PyTorch's order (geometry.h).
  __device__ float oks(int64_t row, int64_t p) const {
    const float* g = gt_kpts + row * K * 3;
    const float scale = rows[row].scale;
    const float sum = geom::cuda_order_sum<float>(K, [&](int k) {
      const float2 q = pd_kpts.load(p * K + k);
      return geom::oks_term<float>(q.x, q.y, __ldg(g + 3 * k), __ldg(g + 3 * k + 1), __ldg(g + 3 * k + 2),
                                   geom::oks_sigma2(__ldg(sigmas + k)), scale);
    });
    return geom::oks_mean(sum, rows[row].n_visible);
  }
};

}  // namespace gpu
}  // namespace lucid
