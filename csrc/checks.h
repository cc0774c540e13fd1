// Argument checks shared by every backend: each message names the argument and shows the bad value.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cmath>

namespace lucid {

// Validates the inputs of the containment pass; returns the box width (4 or 5).
inline int64_t check_points_in_boxes_args(const at::Tensor& anc_points, const at::Tensor& gt_bboxes,
                                          const at::Tensor& mask_gt, double stride_val) {
  TORCH_CHECK(anc_points.dim() == 2 && anc_points.size(1) == 2, "anc_points must be (A, 2), got ",
              anc_points.sizes());
  TORCH_CHECK(gt_bboxes.dim() == 3 && (gt_bboxes.size(2) == 4 || gt_bboxes.size(2) == 5),
              "gt_bboxes must be (B, M, 4) or (B, M, 5), got ", gt_bboxes.sizes());
  TORCH_CHECK(gt_bboxes.scalar_type() == at::kFloat || gt_bboxes.scalar_type() == at::kDouble,
              "gt_bboxes must be float32 or float64, got ", gt_bboxes.scalar_type());
  TORCH_CHECK(anc_points.scalar_type() == gt_bboxes.scalar_type(), "anc_points must have the dtype of gt_bboxes (",
              gt_bboxes.scalar_type(), "), got ", anc_points.scalar_type());
  const bool mask_shape_ok = (mask_gt.dim() == 3 && mask_gt.size(2) == 1) || mask_gt.dim() == 2;
  TORCH_CHECK(mask_shape_ok && mask_gt.size(0) == gt_bboxes.size(0) && mask_gt.size(1) == gt_bboxes.size(1),
              "mask_gt must be (B, M, 1) or (B, M) matching gt_bboxes ", gt_bboxes.sizes(), ", got ", mask_gt.sizes());
  TORCH_CHECK(anc_points.device() == gt_bboxes.device() && mask_gt.device() == gt_bboxes.device(),
              "anc_points, gt_bboxes and mask_gt must be on one device, got ", anc_points.device(), ", ",
              gt_bboxes.device(), " and ", mask_gt.device());
  TORCH_CHECK(std::isfinite(stride_val) && stride_val > 0, "stride_val must be a positive number, got ", stride_val);
  return gt_bboxes.size(2);
}

}  // namespace lucid
