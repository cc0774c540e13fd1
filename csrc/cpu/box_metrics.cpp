// torch.ops.lucid.box_metrics on the CPU (step 2, dense): at each candidate pair the class score of the object's
// label, the overlap and the metric s^alpha * o^beta; 0 elsewhere.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <atomic>
#include <vector>

#include "checks.h"
#include "cpu/overlap_metric.h"
#include "rules.h"

namespace lucid {
namespace cpu {
namespace {

template <typename S, typename T>
void box_metrics_rows(const at::Tensor& scores, const at::Tensor& pd, const at::Tensor& labels, const at::Tensor& gt,
                      const at::Tensor& cand, double alpha, double beta, at::Tensor& align, at::Tensor& overlaps) {
  const int64_t B = scores.size(0), A = scores.size(1), C = scores.size(2), M = gt.size(1), D = gt.size(2);
  const auto gp = BoxPrep<T>::make(gt), pp = BoxPrep<T>::make(pd);
  const S* s = scores.data_ptr<S>();
  const T* gd = gt.data_ptr<T>();
  const T* pdd = pd.data_ptr<T>();
  const int64_t* lab = labels.data_ptr<int64_t>();
  const bool* c = cand.data_ptr<bool>();
  T* al = align.data_ptr<T>();
  T* ov = overlaps.data_ptr<T>();
  std::atomic<bool> bad_label{false};
  at::parallel_for(0, B * M, 1, [&](int64_t begin, int64_t end) {
    OverlapBatch<T> batch(gd, gp, pdd, pp, D);
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
        al[row * A + a] = rules::align_metric<S, T>(s[pi[k] * C + label], o[k], alpha, beta);
      }
    }
  });
  TORCH_CHECK_VALUE(!bad_label, "gt_labels: a candidate pair has a label outside [0, ", C, ")");
}

std::tuple<at::Tensor, at::Tensor> box_metrics_cpu(const at::Tensor& pd_scores, const at::Tensor& pd_bboxes,
                                                   const at::Tensor& gt_labels, const at::Tensor& gt_bboxes,
                                                   const at::Tensor& candidates, double alpha, double beta) {
  const PairDims d = check_box_metrics_args(pd_scores, pd_bboxes, gt_labels, gt_bboxes, candidates);
  const int64_t B = d.B, M = d.M;
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

}  // namespace

TORCH_LIBRARY_IMPL(lucid, CPU, m) { m.impl("box_metrics", &box_metrics_cpu); }

}  // namespace cpu
}  // namespace lucid
