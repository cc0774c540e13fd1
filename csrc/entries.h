// The entry points of the ops that both backends implement alike, one template each for both backends: they check
// the arguments (checks.h), allocate the outputs and hand the call to the backend.
// - Entries: the three fused assignments (assign, assign_pose, assign_seg): the rule set read, the call handed to the
//   backend's run() (cpu/assign.cpp, cuda/assign.cu) with the pose or mask inputs, or none.
// - LsapEntry: the linear sum assignment: the outputs allocated, the batch handed to the backend's solve()
//   (cpu/linear_sum_assignment.cpp, cuda/linear_sum_assignment.cu), a matrix's outputs squeezed.
#pragma once

#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>
#include <tuple>

#include "amp.h"
#include "assign_io.h"
#include "checks.h"
#include "mask_decode.h"

namespace lucid {

using Outputs5 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// A backend's whole assignment, for checked arguments; pose and seg null for the box assignment.
using RunFn = Outputs5 (*)(const PairDims& d, const at::Tensor& pd_scores, const at::Tensor& pd_bboxes,
                           const at::Tensor& anc_points, const at::Tensor& gt_labels, const at::Tensor& gt_bboxes,
                           const at::Tensor& mask_gt, int64_t topk, int64_t topk2, int64_t num_classes, double alpha,
                           double beta, double eps, const geom::RuleSet<double>& rule, const PoseArgs* pose,
                           const SegArgs* seg, const AutocastDtype& autocast_dtype);

template <RunFn run>
struct Entries {
  static Outputs5 assign(const at::Tensor& pd_scores, const at::Tensor& pd_bboxes, const at::Tensor& anc_points,
                         const at::Tensor& gt_labels, const at::Tensor& gt_bboxes, const at::Tensor& mask_gt,
                         int64_t topk, int64_t topk2, int64_t num_classes, double alpha, double beta, double eps,
                         double stride_val, c10::string_view rules, std::optional<double> first_stride,
                         AutocastDtype autocast_dtype) {
    const PairDims d = check_assign_args(pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt, topk, topk2,
                                         num_classes, stride_val, eps);
    return run(d, pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt, topk, topk2, num_classes, alpha,
               beta, eps, rule_set(rules, d.D, stride_val, first_stride), nullptr, nullptr, autocast_dtype);
  }

  static Outputs5 assign_pose(const at::Tensor& pd_scores, const at::Tensor& pd_bboxes, const at::Tensor& anc_points,
                              const at::Tensor& gt_labels, const at::Tensor& gt_bboxes, const at::Tensor& mask_gt,
                              const at::Tensor& anc_strides, const at::Tensor& pd_kpts, const at::Tensor& gt_kpts,
                              const at::Tensor& sigmas, int64_t topk, int64_t topk2, int64_t num_classes,
                              double alpha, double beta, double eps, double stride_val, double level_lo,
                              double level_hi, c10::string_view rules, std::optional<double> first_stride,
                              AutocastDtype autocast_dtype) {
    const PairDims d = check_assign_args(pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt, topk, topk2,
                                         num_classes, stride_val, eps);
    const int64_t K =
        check_assign_pose_args(d, pd_scores, gt_bboxes, anc_strides, pd_kpts, gt_kpts, sigmas, level_lo, level_hi);
    const PoseArgs pose{anc_strides, pd_kpts, gt_kpts, sigmas, K, level_lo, level_hi};
    return run(d, pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt, topk, topk2, num_classes, alpha,
               beta, eps, rule_set(rules, d.D, stride_val, first_stride), &pose, nullptr, autocast_dtype);
  }

  static Outputs5 assign_seg(const at::Tensor& pd_scores, const at::Tensor& pd_bboxes, const at::Tensor& anc_points,
                             const at::Tensor& gt_labels, const at::Tensor& gt_bboxes, const at::Tensor& mask_gt,
                             const at::Tensor& pd_coef, const at::Tensor& mask_scale, const at::Tensor& proto,
                             const at::Tensor& gt_masks, int64_t topk, int64_t topk2, int64_t num_classes,
                             double alpha, double beta, double eps, double stride_val, c10::string_view rules,
                             std::optional<double> first_stride, AutocastDtype autocast_dtype) {
    const PairDims d = check_assign_args(pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt, topk, topk2,
                                         num_classes, stride_val, eps);
    check_assign_seg_args(d, pd_scores, gt_bboxes, pd_coef, mask_scale, proto, gt_masks);
    TORCH_CHECK_TYPE(autocast_dtype.has_value() || pd_coef.scalar_type() == proto.scalar_type(),
                     "pd_coef and proto must have one dtype outside autocast (their product decodes the masks), got ",
                     pd_coef.scalar_type(), " and ", proto.scalar_type());
    const SegArgs seg{pd_coef, mask_scale, proto, gt_masks, std::min(kSegTopkFactor * topk, d.A), autocast_dtype};
    return run(d, pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt, topk, topk2, num_classes, alpha,
               beta, eps, rule_set(rules, d.D, stride_val, first_stride), nullptr, &seg, autocast_dtype);
  }

  static void register_in(torch::Library& m) {
    m.impl("assign", &assign);
    m.impl("assign_pose", &assign_pose);
    m.impl("assign_seg", &assign_seg);
  }
};

using Outputs2 = std::tuple<at::Tensor, at::Tensor>;
using Outputs3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

// A backend's solve of a checked batch of d.B >= 1 problems: each problem's result to `out` (lsap::Result), and
// info (B,) to fill, every problem's.
using SolveFn = void (*)(const LsapDims& d, const at::Tensor& cost, const std::optional<at::Tensor>& sizes,
                         const lsap::Result& out, at::Tensor& info);

template <SolveFn solve>
struct LsapEntry {
  // SciPy's pairs: (rows, cols, info)
  static Outputs3 linear_sum_assignment(const at::Tensor& cost, const std::optional<at::Tensor>& sizes) {
    const LsapDims d = check_linear_sum_assignment_args(cost, sizes);
    const auto index_opts = cost.options().dtype(at::kLong);
    auto rows = at::empty({d.B, d.K}, index_opts);
    auto cols = at::empty({d.B, d.K}, index_opts);
    auto info = at::empty({d.B}, cost.options().dtype(at::kInt));
    const lsap::Result out{rows.data_ptr<int64_t>(), cols.data_ptr<int64_t>(), nullptr, d.K, d.R, false};
    if (d.B > 0) solve(d, cost, sizes, out, info);
    if (!d.batched) return {rows.squeeze(0), cols.squeeze(0), info.squeeze(0)};
    return {rows, cols, info};
  }

  // each row's column: (columns, info)
  static Outputs2 columns(const at::Tensor& cost, const std::optional<at::Tensor>& sizes) {
    const LsapDims d = check_linear_sum_assignment_args(cost, sizes);
    auto columns = at::empty({d.B, d.R}, cost.options().dtype(at::kLong));
    auto info = at::empty({d.B}, cost.options().dtype(at::kInt));
    const lsap::Result out{nullptr, nullptr, columns.data_ptr<int64_t>(), d.K, d.R, true};
    if (d.B > 0) solve(d, cost, sizes, out, info);
    if (!d.batched) return {columns.squeeze(0), info.squeeze(0)};
    return {columns, info};
  }

  static void register_in(torch::Library& m) {
    m.impl("linear_sum_assignment", &linear_sum_assignment);
    m.impl("linear_sum_assignment.columns", &columns);
  }
};

}  // namespace lucid
