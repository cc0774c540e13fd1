// Argument checks shared by every backend: each message names the argument and shows the bad value.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
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

// Validates the inputs of the fused assignment; returns the box width (4 or 5). Label ranges are checked by the
// backend (the CPU can read them; the GPU must not synchronise).
inline int64_t check_assign_args(const at::Tensor& pd_scores, const at::Tensor& pd_bboxes, const at::Tensor& anc_points,
                                 const at::Tensor& gt_labels, const at::Tensor& gt_bboxes, const at::Tensor& mask_gt,
                                 int64_t topk, int64_t topk2, int64_t num_classes, double stride_val) {
  TORCH_CHECK(pd_scores.dim() == 3, "pd_scores must be (B, A, C), got ", pd_scores.sizes());
  const int64_t B = pd_scores.size(0), A = pd_scores.size(1), C = pd_scores.size(2);
  TORCH_CHECK(gt_bboxes.dim() == 3 && (gt_bboxes.size(2) == 4 || gt_bboxes.size(2) == 5) && gt_bboxes.size(0) == B,
              "gt_bboxes must be (B, M, 4) or (B, M, 5) with B = ", B, " (from pd_scores), got ", gt_bboxes.sizes());
  const int64_t M = gt_bboxes.size(1), D = gt_bboxes.size(2);
  TORCH_CHECK(pd_bboxes.dim() == 3 && pd_bboxes.size(0) == B && pd_bboxes.size(1) == A && pd_bboxes.size(2) == D,
              "pd_bboxes must be (B, A, ", D, ") = (", B, ", ", A, ", ", D, "), got ", pd_bboxes.sizes());
  TORCH_CHECK(anc_points.dim() == 2 && anc_points.size(0) == A && anc_points.size(1) == 2,
              "anc_points must be (A, 2) with A = ", A, ", got ", anc_points.sizes());
  auto is_bm1 = [&](const at::Tensor& t) {
    return (t.dim() == 3 && t.size(0) == B && t.size(1) == M && t.size(2) == 1) ||
           (t.dim() == 2 && t.size(0) == B && t.size(1) == M);
  };
  TORCH_CHECK(is_bm1(gt_labels), "gt_labels must be (B, M, 1) = (", B, ", ", M, ", 1), got ", gt_labels.sizes());
  TORCH_CHECK(is_bm1(mask_gt), "mask_gt must be (B, M, 1) = (", B, ", ", M, ", 1), got ", mask_gt.sizes());
  TORCH_CHECK(num_classes == C, "num_classes is ", num_classes, " but pd_scores has ", C, " classes");
  const auto box_t = gt_bboxes.scalar_type();
  TORCH_CHECK(box_t == at::kFloat || box_t == at::kDouble, "gt_bboxes must be float32 or float64, got ", box_t);
  TORCH_CHECK(pd_bboxes.scalar_type() == box_t, "pd_bboxes must have the dtype of gt_bboxes (", box_t, "), got ",
              pd_bboxes.scalar_type());
  const auto anc_t = anc_points.scalar_type();
  TORCH_CHECK(anc_t == box_t || (c10::isFloatingType(anc_t) && c10::promoteTypes(anc_t, box_t) == box_t),
              "anc_points must have the dtype of gt_bboxes (", box_t, ") or a narrower float type, got ", anc_t);
  const auto st = pd_scores.scalar_type();
  const bool scores_ok = box_t == at::kFloat ? (st == at::kFloat || st == at::kHalf || st == at::kBFloat16)
                                             : st == at::kDouble;
  TORCH_CHECK(scores_ok, "pd_scores must be float32, float16 or bfloat16 with float32 boxes, or float64 with float64 ",
              "boxes; got ", st, " with ", box_t, " boxes");
  TORCH_CHECK(!at::isComplexType(gt_labels.scalar_type()), "gt_labels must be real, got ", gt_labels.scalar_type());
  for (const auto* t : {&pd_bboxes, &anc_points, &gt_labels, &gt_bboxes, &mask_gt}) {
    TORCH_CHECK(t->device() == pd_scores.device(), "all inputs must be on one device: pd_scores is on ",
                pd_scores.device(), ", another input on ", t->device());
  }
  TORCH_CHECK(topk >= 1, "topk must be >= 1, got ", topk);
  TORCH_CHECK(topk2 >= 1, "topk2 must be >= 1, got ", topk2);
  TORCH_CHECK(M == 0 || (topk <= A && topk2 <= A), "topk (", topk, ") and topk2 (", topk2,
              ") must not exceed the number of anchors (", A, ")");
  TORCH_CHECK(std::isfinite(stride_val) && stride_val > 0, "stride_val must be a positive number, got ", stride_val);
  return D;
}

}  // namespace lucid
