// Pose on the CPU (docs/spec.md, "Pose"): what the level gate of step 1 and the keypoint OKS of step 2 need, built
// once per call (PoseRows), and the OKS of one pair (geometry.h). The per-row and per-anchor values that the reference
// computes with tensor operations (the object's side and OKS scale, the strides' bounds) are computed with the same
// ATen operations here, so that they carry the reference's bits on the CPU.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstdint>
#include <vector>

#include "geometry.h"

namespace lucid {
namespace cpu {

template <typename T>
struct PoseRows {
  int64_t K = 0;
  // rule set 8.4.180 (geometry.h RuleSet): no level gate, and the overlap is the mean of box overlap and OKS
  bool mean = false;
  // per row (B*M): the side of the level gate, the OKS scale, the visible keypoints, and whether the gate applies
  // (some anchor inside the row's region passes it; otherwise the row keeps every anchor inside)
  at::Tensor side_h, scale_h, nvis_h, gk_h, pk_h, sig2_h, lo_h, hi_h, smallest_h, largest_h;
  const T* side = nullptr;
  const T* scale = nullptr;
  const int64_t* nvis = nullptr;
  std::vector<uint8_t> gated;
  // per anchor (A): the bounds lo * t and hi * t of its stride t in the strides' dtype, widened; t is the smallest
  // (largest) stride of all
  const double* lo_t = nullptr;
  const double* hi_t = nullptr;
  const bool* smallest = nullptr;
  const bool* largest = nullptr;
  const T* gk = nullptr;     // (B*M, K, 3) the objects' keypoints
  const float* pk = nullptr;  // (B*A, K, 2) the predicted keypoints rounded to float32
  const T* sig2 = nullptr;   // (K) (2 sigma)^2

  // gt_bboxes (B, M, 4), anc_strides (A,), pd_kpts (B, A, K, 2), gt_kpts (B, M, K, 3), sigmas (K,): checked.
  static PoseRows make(const at::Tensor& gt_bboxes, const at::Tensor& anc_strides, const at::Tensor& pd_kpts,
                       const at::Tensor& gt_kpts, const at::Tensor& sigmas, double eps, double level_lo,
                       double level_hi) {
    PoseRows r;
    r.K = gt_kpts.size(2);
    const auto box = gt_bboxes.reshape({-1, 4});
    const auto area = (box.select(1, 2) - box.select(1, 0)) * (box.select(1, 3) - box.select(1, 1));
    r.side_h = area.clamp_min(0).sqrt().contiguous();
    r.scale_h = (area * geom::kOksAreaScale + eps).contiguous();
    r.nvis_h = gt_kpts.select(-1, 2).gt(0).sum(-1).reshape({-1}).contiguous();
    r.gk_h = gt_kpts.contiguous();
    r.pk_h = pd_kpts.to(at::kFloat).contiguous();
    r.sig2_h = (sigmas * 2).pow(2).contiguous();
    r.lo_h = (anc_strides * level_lo).to(at::kDouble).contiguous();
    r.hi_h = (anc_strides * level_hi).to(at::kDouble).contiguous();
    r.smallest_h = anc_strides.eq(anc_strides.min()).contiguous();
    r.largest_h = anc_strides.eq(anc_strides.max()).contiguous();
    r.side = r.side_h.data_ptr<T>();
    r.scale = r.scale_h.data_ptr<T>();
    r.nvis = r.nvis_h.data_ptr<int64_t>();
    r.gk = r.gk_h.data_ptr<T>();
    r.pk = r.pk_h.data_ptr<float>();
    r.sig2 = r.sig2_h.data_ptr<T>();
    r.lo_t = r.lo_h.data_ptr<double>();
    r.hi_t = r.hi_h.data_ptr<double>();
    r.smallest = r.smallest_h.data_ptr<bool>();
    r.largest = r.largest_h.data_ptr<bool>();
    return r;
  }

  // Anchor a passes the level gate of `row`.
  bool passes(int64_t row, int64_t a) const {
    return geom::level_pass<double>(static_cast<double>(side[row]), lo_t[a], hi_t[a], smallest[a], largest[a]);
  }

  // Step 1 after containment: the gate, where it applies to the row.
  bool gate(int64_t row, int64_t a) const { return !gated[row] || passes(row, a); }

  // Which rows the gate applies to: a real row with an anchor inside its region (`inside(row, a)`) that passes.
  template <typename Inside>
  void find_gated(int64_t rows, int64_t A, const bool* valid, Inside inside) {
    gated.assign(rows, 0);
    at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        if (!valid[row]) continue;
        for (int64_t a = 0; a < A && !gated[row]; ++a) gated[row] = inside(row, a) && passes(row, a);
      }
    });
  }

  // Step 2's overlap of object `row` and prediction `pred` (= b*A + a) when the object has a visible keypoint.
  T oks(int64_t row, int64_t pred) const {
    const T* g = gk + row * K * 3;
    const float* p = pk + pred * K * 2;
    const T s = scale[row];
    const T sum = geom::cuda_order_sum<T>(static_cast<int>(K), [&](int k) {
      return geom::oks_term<T>(T(p[2 * k]), T(p[2 * k + 1]), g[3 * k], g[3 * k + 1], g[3 * k + 2], sig2[k], s);
    });
    return geom::oks_mean(sum, static_cast<int>(nvis[row]));
  }
};

}  // namespace cpu
}  // namespace lucid
