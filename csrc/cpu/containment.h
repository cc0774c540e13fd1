// Step 1 on the CPU, containment: the candidate region of every object row, built once, and the test of an anchor
// against it (geometry.h). cos and sin of the angles come from ATen, the library the reference uses on the CPU.
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "geometry.h"

namespace lucid {
namespace cpu {

// Candidate regions of every (b, m) row, with the side floor of the rule set applied to real objects.
template <typename T>
struct Regions {
  std::vector<geom::HbbRegion<T>> hbb;
  std::vector<geom::ObbRegion<T>> obb;
  int64_t box_dim = 4;

  // boxes: contiguous (B*M, D); valid: (B*M) bool
  static Regions make(const at::Tensor& boxes, const bool* valid, const geom::RuleSet<T>& rule) {
    Regions r;
    r.box_dim = boxes.size(-1);
    const auto flat = boxes.reshape({-1, r.box_dim}).contiguous();
    const int64_t n = flat.size(0);
    const T* b = flat.data_ptr<T>();
    if (r.box_dim == 4) {
      r.hbb.resize(n);
      for (int64_t i = 0; i < n; ++i) {
        const T* x = b + 4 * i;
        r.hbb[i] = geom::hbb_candidate_region<T>(x[0], x[1], x[2], x[3], valid[i], rule);
      }
    } else {
      const auto theta = flat.select(1, 4);
      const auto cos_t = theta.cos().contiguous(), sin_t = theta.sin().contiguous();
      const T* c = cos_t.data_ptr<T>();
      const T* s = sin_t.data_ptr<T>();
      r.obb.resize(n);
      for (int64_t i = 0; i < n; ++i) {
        const T* x = b + 5 * i;
        r.obb[i] = geom::obb_candidate_region<T>(x[0], x[1], x[2], x[3], c[i], s[i], valid[i], rule);
      }
    }
    return r;
  }

  bool contains(int64_t row, T px, T py) const {
    return box_dim == 4 ? geom::hbb_contains(hbb[row], px, py) : geom::obb_contains(obb[row], px, py);
  }
};

}  // namespace cpu
}  // namespace lucid
