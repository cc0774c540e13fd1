// The dense pass ops on the CPU: pair_overlaps, box_metrics and resolve_conflicts. Each matches one step of the
// reference (lucid_assign/reference.py) and is meant for users who want that step alone; the fused assign does not
// call them.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <atomic>

#include "checks.h"
#include "cpu/pair_metrics_cpu.h"
#include "geometry.h"

namespace lucid {
namespace {

at::Tensor pair_overlaps_cpu(const at::Tensor& gt_bboxes, const at::Tensor& pd_bboxes) {
  TORCH_CHECK(gt_bboxes.dim() == 2 && (gt_bboxes.size(1) == 4 || gt_bboxes.size(1) == 5),
              "gt_bboxes must be (N, 4) or (N, 5), got ", gt_bboxes.sizes());
  TORCH_CHECK(pd_bboxes.sizes() == gt_bboxes.sizes(), "pd_bboxes must have the shape of gt_bboxes ",
              gt_bboxes.sizes(), ", got ", pd_bboxes.sizes());
  TORCH_CHECK(gt_bboxes.scalar_type() == at::kFloat || gt_bboxes.scalar_type() == at::kDouble,
              "gt_bboxes must be float32 or float64, got ", gt_bboxes.scalar_type());
  TORCH_CHECK(pd_bboxes.scalar_type() == gt_bboxes.scalar_type(), "pd_bboxes must have the dtype of gt_bboxes (",
              gt_bboxes.scalar_type(), "), got ", pd_bboxes.scalar_type());
  TORCH_CHECK(pd_bboxes.device() == gt_bboxes.device(), "gt_bboxes and pd_bboxes must be on one device");
  const int64_t n = gt_bboxes.size(0), d = gt_bboxes.size(1);
  auto out = at::empty({n}, gt_bboxes.options());
  if (n == 0) return out;
  const auto g = gt_bboxes.contiguous(), p = pd_bboxes.contiguous();
  AT_DISPATCH_FLOATING_TYPES(g.scalar_type(), "pair_overlaps_cpu", [&] {
    const auto gp = cpu::BoxPrep<scalar_t>::make(g), pp = cpu::BoxPrep<scalar_t>::make(p);
    scalar_t* o = out.data_ptr<scalar_t>();
    at::parallel_for(0, n, 2048, [&](int64_t begin, int64_t end) {
      cpu::OverlapBatch<scalar_t> batch(g.data_ptr<scalar_t>(), gp, p.data_ptr<scalar_t>(), pp, d);
      std::vector<int64_t> idx(end - begin);
      for (int64_t i = begin; i < end; ++i) idx[i - begin] = i;
      batch.run(idx.data(), idx.data(), end - begin, o + begin);
    });
  });
  return out;
}

template <typename S, typename T>
void box_metrics_rows(const at::Tensor& scores, const at::Tensor& pd, const at::Tensor& labels, const at::Tensor& gt,
                      const at::Tensor& cand, double alpha, double beta, at::Tensor& align, at::Tensor& overlaps) {
  const int64_t B = scores.size(0), A = scores.size(1), C = scores.size(2), M = gt.size(1), D = gt.size(2);
  const auto gp = cpu::BoxPrep<T>::make(gt), pp = cpu::BoxPrep<T>::make(pd);
  const S* s = scores.data_ptr<S>();
  const T* gd = gt.data_ptr<T>();
  const T* pdd = pd.data_ptr<T>();
  const int64_t* lab = labels.data_ptr<int64_t>();
  const bool* c = cand.data_ptr<bool>();
  T* al = align.data_ptr<T>();
  T* ov = overlaps.data_ptr<T>();
  std::atomic<bool> bad_label{false};
  at::parallel_for(0, B * M, 1, [&](int64_t begin, int64_t end) {
    cpu::OverlapBatch<T> batch(gd, gp, pdd, pp, D);
    std::vector<int64_t> gi, pi;
    std::vector<T> o;
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = row / M;
      const int64_t label = lab[row];
      gi.clear();
      pi.clear();
      for (int64_t a = 0; a < A; ++a) {
        const int64_t i = row * A + a;
        al[i] = T(0);
        ov[i] = T(0);
        if (c[i]) {
          gi.push_back(row);
          pi.push_back(b * A + a);
        }
      }
      if (gi.empty()) continue;
      if (label < 0 || label >= C) {
        bad_label = true;
        continue;
      }
      o.resize(gi.size());
      batch.run(gi.data(), pi.data(), static_cast<int64_t>(gi.size()), o.data());
      for (size_t k = 0; k < gi.size(); ++k) {
        const int64_t a = pi[k] - b * A;
        ov[row * A + a] = o[k];
        al[row * A + a] = geom::mul(cpu::score_pow<S, T>(s[pi[k] * C + label], alpha), geom::pow_scalar(o[k], beta));
      }
    }
  });
  TORCH_CHECK(!bad_label, "gt_labels: a candidate pair has a label outside [0, ", C, ")");
}

std::tuple<at::Tensor, at::Tensor> box_metrics_cpu(const at::Tensor& pd_scores, const at::Tensor& pd_bboxes,
                                                   const at::Tensor& gt_labels, const at::Tensor& gt_bboxes,
                                                   const at::Tensor& candidates, double alpha, double beta) {
  TORCH_CHECK(candidates.dim() == 3 && candidates.scalar_type() == at::kBool, "candidates must be (B, M, A) bool, got ",
              candidates.sizes(), " ", candidates.scalar_type());
  const int64_t B = candidates.size(0), M = candidates.size(1);
  const auto mask = at::ones({B, M}, candidates.options());
  check_assign_args(pd_scores, pd_bboxes, pd_bboxes.select(2, 0).new_zeros({pd_scores.size(1), 2}), gt_labels,
                    gt_bboxes, mask, 1, 1, pd_scores.size(2), 1.0);
  TORCH_CHECK(candidates.size(2) == pd_scores.size(1), "candidates must be (B, M, A) = (", B, ", ", M, ", ",
              pd_scores.size(1), "), got ", candidates.sizes());
  const auto box_t = gt_bboxes.scalar_type();
  auto align = at::empty(candidates.sizes(), pd_scores.options().dtype(box_t));
  auto overlaps = at::empty(candidates.sizes(), pd_bboxes.options());
  if (align.numel() == 0) return {align, overlaps};
  const auto scores = pd_scores.contiguous(), pd = pd_bboxes.contiguous(), gt = gt_bboxes.contiguous();
  const auto labels = gt_labels.reshape({B, M}).to(at::kLong).contiguous();
  const auto cand = candidates.contiguous();
  AT_DISPATCH_FLOATING_TYPES(box_t, "box_metrics_cpu", [&] {
    using T = scalar_t;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, scores.scalar_type(), "box_metrics_cpu_scores", [&] {
      box_metrics_rows<scalar_t, T>(scores, pd, labels, gt, cand, alpha, beta, align, overlaps);
    });
  });
  return {align, overlaps};
}

at::Tensor resolve_conflicts_cpu(const at::Tensor& mask_pos, const at::Tensor& overlaps) {
  TORCH_CHECK(mask_pos.dim() == 3 && mask_pos.scalar_type() == at::kBool, "mask_pos must be (B, M, A) bool, got ",
              mask_pos.sizes(), " ", mask_pos.scalar_type());
  TORCH_CHECK(overlaps.sizes() == mask_pos.sizes(), "overlaps must have the shape of mask_pos ", mask_pos.sizes(),
              ", got ", overlaps.sizes());
  TORCH_CHECK(overlaps.scalar_type() == at::kFloat || overlaps.scalar_type() == at::kDouble,
              "overlaps must be float32 or float64, got ", overlaps.scalar_type());
  TORCH_CHECK(overlaps.device() == mask_pos.device(), "mask_pos and overlaps must be on one device");
  const int64_t B = mask_pos.size(0), M = mask_pos.size(1), A = mask_pos.size(2);
  const auto mp = mask_pos.contiguous();
  auto out = mp.clone();
  if (out.numel() == 0) return out;
  const auto ov = overlaps.contiguous();
  AT_DISPATCH_FLOATING_TYPES(ov.scalar_type(), "resolve_conflicts_cpu", [&] {
    const bool* m = mp.data_ptr<bool>();
    const scalar_t* o = ov.data_ptr<scalar_t>();
    bool* r = out.data_ptr<bool>();
    at::parallel_for(0, B * A, 1024, [&](int64_t begin, int64_t end) {
      for (int64_t ba = begin; ba < end; ++ba) {
        const int64_t b = ba / A, a = ba % A;
        const int64_t base = b * M * A + a;
        int64_t count = 0;
        for (int64_t k = 0; k < M && count < 2; ++k) count += m[base + k * A];
        if (count < 2) continue;
        // first maximum over all rows; NaN counts as the maximum, as in torch.argmax
        int64_t best = 0;
        scalar_t best_v = o[base];
        for (int64_t k = 1; k < M && !geom::isnan_(best_v); ++k) {
          const scalar_t v = o[base + k * A];
          if (geom::isnan_(v) || v > best_v) {
            best = k;
            best_v = v;
          }
        }
        for (int64_t k = 0; k < M; ++k) r[base + k * A] = (k == best);
      }
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(lucid, CPU, m) {
  m.impl("pair_overlaps", &pair_overlaps_cpu);
  m.impl("box_metrics", &box_metrics_cpu);
  m.impl("resolve_conflicts", &resolve_conflicts_cpu);
}

}  // namespace lucid
