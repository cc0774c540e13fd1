// Step 2 on the CPU, overlap: per-box values prepared once (BoxPrep) and the overlaps of batches of pairs from them
// (OverlapBatch). Used by the ops pair_overlaps and box_metrics and by the fused assign; the metric itself is
// rules::align_metric.
//
// Transcendental functions come from ATen, the math library the reference uses on the CPU, so that overlaps carry
// the reference's exact bits: per box (atan of the aspect ratio, cos/sin of the angle) and, in batches, per pair
// (sqrt, log and exp of probiou; ATen's CPU sqrt is not always the correctly rounded one). ATen evaluates those the
// same way wherever an element sits in a tensor. The exception is pow with a general exponent (the metric's o^beta,
// s^alpha): ATen's differs between vector bodies and tails, so the reference's own bits depend on a pair's position;
// the C library's pow is used, within an ulp of either.
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "cpu/keypoints.h"
#include "cpu/seg_masks.h"
#include "geometry.h"

namespace lucid {
namespace cpu {

// Per-box values of the overlap: atan(w / (h + eps)) for HBB, the Gaussian for OBB. boxes: (..., 4 | 5) of dtype T.
template <typename T>
struct BoxPrep {
  at::Tensor holder;  // keeps the data alive
  const T* data = nullptr;
  int64_t width = 0;  // values per box: 1 (HBB) or 3 (OBB)

  static BoxPrep make(const at::Tensor& boxes) {
    BoxPrep p;
    const auto flat = boxes.reshape({-1, boxes.size(-1)});
    const int64_t n = flat.size(0);
    if (boxes.size(-1) == 4) {
      const auto box = flat.contiguous();
      const T* d = box.data_ptr<T>();
      auto aspect = at::empty({n}, flat.options());
      T* r = aspect.data_ptr<T>();
      for (int64_t i = 0; i < n; ++i) r[i] = geom::ciou_aspect(d[4 * i], d[4 * i + 1], d[4 * i + 2], d[4 * i + 3]);
      p.holder = aspect.atan_();
      p.width = 1;
    } else {
      const auto theta = flat.select(1, 4);
      const auto cos_t = theta.cos().contiguous(), sin_t = theta.sin().contiguous();
      const auto wh = flat.narrow(1, 2, 2).contiguous();
      p.holder = at::empty({n, 3}, flat.options());
      const T* c = cos_t.data_ptr<T>();
      const T* s = sin_t.data_ptr<T>();
      const T* d = wh.data_ptr<T>();
      T* out = p.holder.data_ptr<T>();
      for (int64_t i = 0; i < n; ++i) {
        const auto g = geom::gaussian<T, /*kReciprocal=*/false>(d[2 * i], d[2 * i + 1], c[i], s[i]);
        out[3 * i] = g.a;
        out[3 * i + 1] = g.b;
        out[3 * i + 2] = g.c;
      }
      p.width = 3;
    }
    p.data = p.holder.data_ptr<T>();
    return p;
  }
};

// Overlaps of pairs of boxes, clamped below at 0. The sqrt, log and exp of probiou go through ATen in batches, so
// that every bit matches the reference on the CPU; all other operations are those of geometry.h. With pose, an
// object with a visible keypoint has the keypoint OKS instead (keypoints.h); with segmentation the overlap is the
// mean of the box overlap and the pair's mask IoU (seg_masks.h).
template <typename T>
class OverlapBatch {
 public:
  // gt: (rows, D) with prepared values gp; pd: (boxes, D) with pp.
  // classic_ciou: CIoU as the peer's releases before 8.4.144 round it (geometry.h ciou).
  OverlapBatch(const T* gt, const BoxPrep<T>& gp, const T* pd, const BoxPrep<T>& pp, int64_t box_dim,
               const PoseRows<T>* pose = nullptr, const SegRows<T>* seg = nullptr, bool classic_ciou = false)
      : gt_(gt), gp_(gp), pd_(pd), pp_(pp), d_(box_dim), pose_(pose), seg_(seg), classic_ciou_(classic_ciou) {}

  // out[k] = overlap(gt row gi[k], prediction pi[k]) for k < n.
  void run(const int64_t* gi, const int64_t* pi, int64_t n, T* out) {
    if (n == 0) return;
    if (d_ == 4) {
      for (int64_t k = 0; k < n; ++k) {
        const bool keypoints = pose_ != nullptr && pose_->nvis[gi[k]] > 0;
        if (keypoints && !pose_->mean) {
          out[k] = pose_->oks(gi[k], pi[k]);
          continue;
        }
        const T* g = gt_ + gi[k] * 4;
        const T* p = pd_ + pi[k] * 4;
        out[k] = geom::clamp_min(
            geom::ciou<T>(g[0], g[1], g[2], g[3], p[0], p[1], p[2], p[3], gp_.data[gi[k]], pp_.data[pi[k]],
                          classic_ciou_),
            T(0));
        if (keypoints) out[k] = geom::mean2(out[k], pose_->oks(gi[k], pi[k]));
        if (seg_ != nullptr) {
          const int64_t a = pi[k] - (gi[k] / seg_->M) * seg_->A;
          out[k] = geom::mean2(out[k], seg_->mask_iou(gi[k], a));
        }
      }
      return;
    }
    t12_.resize(n);
    det_.resize(n);
    arg_.resize(n);
    val_.resize(n);
    for (int64_t k = 0; k < n; ++k) {
      const T* g = gt_ + gi[k] * 5;
      const T* p = pd_ + pi[k] * 5;
      const T* gg = gp_.data + gi[k] * 3;
      const T* pg = pp_.data + pi[k] * 3;
      const auto pre = geom::probiou_pre<T>(g[0], g[1], {gg[0], gg[1], gg[2]}, p[0], p[1], {pg[0], pg[1], pg[2]});
      t12_[k] = pre.t12;
      det_[k] = pre.det;
      arg_[k] = pre.q;
    }
    auto val = blob(val_.data(), n);
    const auto arg = blob(arg_.data(), n);
    at::sqrt_out(val, arg);
    for (int64_t k = 0; k < n; ++k) arg_[k] = geom::probiou_log_arg(det_[k], val_[k]);
    at::log_out(val, arg);
    for (int64_t k = 0; k < n; ++k) arg_[k] = -geom::probiou_bd(t12_[k], val_[k]);
    at::exp_out(val, arg);
    for (int64_t k = 0; k < n; ++k) arg_[k] = geom::probiou_sqrt_arg(val_[k]);
    at::sqrt_out(val, arg);
    for (int64_t k = 0; k < n; ++k) out[k] = geom::clamp_min(geom::sub(T(1), val_[k]), T(0));
  }

 private:
  static at::Tensor blob(T* data, int64_t n) {
    return at::from_blob(data, {n}, at::TensorOptions().dtype(c10::CppTypeToScalarType<T>::value));
  }
  const T* gt_;
  const BoxPrep<T>& gp_;
  const T* pd_;
  const BoxPrep<T>& pp_;
  int64_t d_;
  const PoseRows<T>* pose_;
  const SegRows<T>* seg_;
  bool classic_ciou_;
  std::vector<T> t12_, det_, arg_, val_;
};

}  // namespace cpu
}  // namespace lucid
