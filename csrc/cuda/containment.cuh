// Step 1 on the GPU, containment: the candidate regions of the objects (geometry.h, with the angle's cos and sin from
// CUDA's math library, as the reference's torch.cos on the device), the test of an anchor against one, and its
// bounding box for the anchor index. Used by the op points_in_boxes and by the fused assignment.
#pragma once

#include <cstdint>

#include "geometry.h"

namespace lucid {
namespace gpu {

// One row's candidate region, copied to registers: the test a row applies to many anchors in a row.
template <typename T>
struct RegionOf {
  int D;
  geom::HbbRegion<T> hbb;
  geom::ObbRegion<T> obb;
  __device__ __forceinline__ bool contains(float2 p) const {
    return D == 4 ? geom::hbb_contains(hbb, T(p.x), T(p.y)) : geom::obb_contains(obb, T(p.x), T(p.y));
  }
};

// The candidate regions of object rows: axis-aligned (D = 4) or oriented (D = 5), one of the two arrays in use.
template <typename T>
struct Regions {
  geom::HbbRegion<T>* hbb;
  geom::ObbRegion<T>* obb;

  // Row j's region from its box (D values); real: a real object, whose short sides get the floor. cos_t and sin_t
  // are those of the angle (D = 5 only).
  __device__ __forceinline__ void put(int64_t j, const T* box, int D, bool real, const geom::RuleSet<T>& rule,
                                      T cos_t, T sin_t) const {
    if (D == 4) {
      hbb[j] = geom::hbb_candidate_region<T>(box[0], box[1], box[2], box[3], real, rule);
    } else {
      obb[j] = geom::obb_candidate_region<T>(box[0], box[1], box[2], box[3], cos_t, sin_t, real, rule);
    }
  }

  __device__ __forceinline__ RegionOf<T> of(int64_t j, int D) const {
    RegionOf<T> r{D, {}, {}};
    if (D == 4) r.hbb = hbb[j];
    else r.obb = obb[j];
    return r;
  }

  __device__ __forceinline__ bool contains(int64_t j, int D, T px, T py) const {
    return D == 4 ? geom::hbb_contains(hbb[j], px, py) : geom::obb_contains(obb[j], px, py);
  }

  // Bounding box of row j's region, widened so that rounding in the exact test cannot reach past it; false when it
  // is not finite.
  __device__ bool bbox(int64_t j, int D, T& x0, T& y0, T& x1, T& y1) const {
    if (D == 4) {
      const auto& r = hbb[j];
      x0 = r.x1, y0 = r.y1, x1 = r.x2, y1 = r.y2;
    } else {
      const auto& r = obb[j];
      const T xs[4] = {r.ax, r.ax + r.abx, r.ax + r.adx, r.ax + r.abx + r.adx};
      const T ys[4] = {r.ay, r.ay + r.aby, r.ay + r.ady, r.ay + r.aby + r.ady};
      x0 = x1 = xs[0];
      y0 = y1 = ys[0];
      for (int k = 1; k < 4; ++k) {
        x0 = fminf(x0, xs[k]);
        x1 = fmaxf(x1, xs[k]);
        y0 = fminf(y0, ys[k]);
        y1 = fmaxf(y1, ys[k]);
      }
    }
    const T margin = T(1e-4) * (fabsf(x0) + fabsf(x1) + fabsf(y0) + fabsf(y1)) + T(1e-6);
    x0 -= margin, y0 -= margin, x1 += margin, y1 += margin;
    return isfinite(x0) && isfinite(x1) && isfinite(y0) && isfinite(y1);
  }
};

}  // namespace gpu
}  // namespace lucid
