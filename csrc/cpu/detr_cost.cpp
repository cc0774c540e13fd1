// torch.ops.lucid.detr_cost on the CPU (docs/spec.md, "DETR matching cost"): detr_cost.h's column cost for every
// (image, query, column), the images' rows as parallel tasks.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <vector>

#include "checks.h"
#include "detr_cost.h"

namespace lucid {
namespace cpu {
namespace {

at::Tensor detr_cost_cpu(const at::Tensor& pred_bboxes, const at::Tensor& pred_scores, const at::Tensor& gt_bboxes,
                         const at::Tensor& gt_cls, const at::Tensor& sizes, int64_t width, c10::ArrayRef<double> gains,
                         double alpha, double gamma, bool sanitize, int64_t l1_order) {
  const DetrCostDims d =
      check_detr_cost_args(pred_bboxes, pred_scores, gt_bboxes, gt_cls, sizes, width, gains, gamma, l1_order);
  const auto s = detr::make_settings(gains[0], gains[1], gains[2], alpha, gamma, sanitize, static_cast<int>(l1_order));
  auto out = at::empty({d.B, d.Q, d.W}, pred_scores.options().dtype(at::kFloat));
  if (out.numel() == 0) return out;
  const auto scores = pred_scores.to(at::kFloat).contiguous(), pd = pred_bboxes.to(at::kFloat).contiguous();
  const auto gt = gt_bboxes.to(at::kFloat).contiguous();
  const auto cls = gt_cls.to(at::kLong).contiguous(), n = sizes.to(at::kLong).contiguous();
  const float* s_ptr = scores.data_ptr<float>();
  const float* pd_ptr = pd.data_ptr<float>();
  const float* gt_ptr = gt.data_ptr<float>();
  const int64_t* cls_ptr = cls.data_ptr<int64_t>();
  const int64_t* n_ptr = n.data_ptr<int64_t>();
  float* o_ptr = out.data_ptr<float>();
  std::vector<int64_t> start(d.B);
  for (int64_t b = 0, total = 0; b < d.B; total += n_ptr[b], ++b) start[b] = total;
  at::parallel_for(0, d.B * d.Q, 1, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = row / d.Q;
      for (int64_t j = 0; j < d.W; ++j) {
        o_ptr[row * d.W + j] =
            detr::column_cost(s_ptr + row * d.C, d.C, pd_ptr + row * 4, gt_ptr, cls_ptr, d.N, start[b], n_ptr[b], j, s);
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(lucid, CPU, m) { m.impl("detr_cost", &detr_cost_cpu); }

}  // namespace cpu
}  // namespace lucid
