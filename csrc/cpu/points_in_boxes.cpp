// torch.ops.lucid.points_in_boxes on the CPU (step 1, containment): the candidate regions of all rows (containment.h,
// as the fused assign builds them), then one task per (image, object) row, testing every anchor.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>

#include "checks.h"
#include "cpu/containment.h"

namespace lucid {
namespace cpu {
namespace {

at::Tensor points_in_boxes_cpu(const at::Tensor& anc_points, const at::Tensor& gt_bboxes, const at::Tensor& mask_gt,
                               double stride_val, c10::string_view rules, std::optional<double> first_stride) {
  const int64_t D = check_points_in_boxes_args(anc_points, gt_bboxes, mask_gt, stride_val);
  const auto rule = rule_set(rules, D, stride_val, first_stride);
  const int64_t B = gt_bboxes.size(0), M = gt_bboxes.size(1), A = anc_points.size(0);
  auto out = at::empty({B, M, A}, gt_bboxes.options().dtype(at::kBool));
  if (out.numel() == 0) return out;
  const auto anc = anc_points.contiguous();
  const auto valid = mask_gt.reshape({B, M}).ne(0).contiguous();
  AT_DISPATCH_FLOATING_TYPES(gt_bboxes.scalar_type(), "points_in_boxes_cpu", [&] {
    using T = scalar_t;
    const auto regions = Regions<T>::make(gt_bboxes, valid.data_ptr<bool>(), geom::rule_as<T>(rule));
    const T* p = anc.data_ptr<T>();
    bool* o = out.data_ptr<bool>();
    const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, A));
    at::parallel_for(0, B * M, grain, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        for (int64_t a = 0; a < A; ++a) o[r * A + a] = regions.contains(r, p[2 * a], p[2 * a + 1]);
      }
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(lucid, CPU, m) { m.impl("points_in_boxes", &points_in_boxes_cpu); }

}  // namespace cpu
}  // namespace lucid
