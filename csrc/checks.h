// The argument checks of the ops, one function per op, called by each backend's implementation before its own
// limits (the CUDA kernels take float32 boxes only). Each message names the argument and shows the bad value.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <optional>
#include <vector>

#include "geometry.h"
#include "lsap.h"

namespace lucid {

// The floating-point dtypes the ops take: torch also counts float8 and float4 as floating point, which none takes.
inline bool is_float_type(c10::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16;
}

// (B, M, 1) or (B, M): one value per object row.
inline bool is_rows(const at::Tensor& t, int64_t B, int64_t M) {
  return (t.dim() == 3 && t.size(0) == B && t.size(1) == M && t.size(2) == 1) ||
         (t.dim() == 2 && t.size(0) == B && t.size(1) == M);
}

// Every tensor of `others` on the device of `first`.
inline void check_one_device(const at::Tensor& first, std::initializer_list<const at::Tensor*> others) {
  for (const auto* t : others) {
    TORCH_CHECK_VALUE(t->device() == first.device(), "all inputs must be on one device: got ", first.device(), " and ",
                      t->device());
  }
}

// The rule sets of the peer's releases (docs/spec.md, "Rule sets"), by the first release of each, for boxes of width
// D. stride_val is the floor (the trainer's stride[1], or stride[0] when it has one), first_stride the trainer's
// stride[0], the floor's threshold in rule sets 8.4.0 and 8.4.8.
inline geom::RuleSet<double> rule_set(c10::string_view rules, int64_t D, double stride_val,
                                      std::optional<double> first_stride) {
  constexpr double kNoFloor = -std::numeric_limits<double>::infinity();
  if (rules == "8.4.144") return {stride_val, stride_val, true, false};
  if (rules == "8.4.180") return {stride_val, stride_val, true, false, /*pose_mean=*/true};
  if (rules == "8.4.128") return {stride_val, stride_val, true, true};
  if (rules == "8.0") return {kNoFloor, 0.0, false, true};
  TORCH_CHECK_VALUE(rules == "8.4.0" || rules == "8.4.8",
                    "rules must be one of '8.0', '8.4.0', '8.4.8', '8.4.128', '8.4.144', '8.4.180', got '", rules, "'");
  TORCH_CHECK_VALUE(first_stride.has_value() && std::isfinite(*first_stride) && *first_stride > 0, "rules '", rules,
                    "' needs first_stride (the trainer's stride[0]), a positive number; got ",
                    first_stride.has_value() ? std::to_string(*first_stride) : std::string("None"));
  if (rules == "8.4.0" && D == 5) return {kNoFloor, 0.0, true, true};  // 8.4.0 floors axis-aligned boxes only
  return {*first_stride, stride_val, true, true};
}

// torch.ops.lucid.points_in_boxes (step 1): returns the box width (4 or 5).
inline int64_t check_points_in_boxes_args(const at::Tensor& anc_points, const at::Tensor& gt_bboxes,
                                          const at::Tensor& mask_gt, double stride_val) {
  TORCH_CHECK_VALUE(anc_points.dim() == 2 && anc_points.size(1) == 2, "anc_points must be (A, 2), got ",
                    anc_points.sizes());
  TORCH_CHECK_VALUE(gt_bboxes.dim() == 3 && (gt_bboxes.size(2) == 4 || gt_bboxes.size(2) == 5),
                    "gt_bboxes must be (B, M, 4) or (B, M, 5), got ", gt_bboxes.sizes());
  TORCH_CHECK_TYPE(gt_bboxes.scalar_type() == at::kFloat || gt_bboxes.scalar_type() == at::kDouble,
                   "gt_bboxes must be float32 or float64, got ", gt_bboxes.scalar_type());
  TORCH_CHECK_TYPE(anc_points.scalar_type() == gt_bboxes.scalar_type(), "anc_points must have the dtype of gt_bboxes (",
                   gt_bboxes.scalar_type(), "), got ", anc_points.scalar_type());
  const bool mask_shape_ok = (mask_gt.dim() == 3 && mask_gt.size(2) == 1) || mask_gt.dim() == 2;
  TORCH_CHECK_VALUE(mask_shape_ok && mask_gt.size(0) == gt_bboxes.size(0) && mask_gt.size(1) == gt_bboxes.size(1),
                    "mask_gt must be (B, M, 1) or (B, M) matching gt_bboxes ", gt_bboxes.sizes(), ", got ",
                    mask_gt.sizes());
  TORCH_CHECK_VALUE(anc_points.device() == gt_bboxes.device() && mask_gt.device() == gt_bboxes.device(),
                    "anc_points, gt_bboxes and mask_gt must be on one device, got ", anc_points.device(), ", ",
                    gt_bboxes.device(), " and ", mask_gt.device());
  TORCH_CHECK_VALUE(std::isfinite(stride_val) && stride_val > 0, "stride_val must be a positive number, got ",
                    stride_val);
  return gt_bboxes.size(2);
}

// The inputs of steps 2-6 that describe pairs: scores, predicted and object boxes and labels. Returns their sizes.
struct PairDims {
  int64_t B, A, C, M, D;
};

inline PairDims check_pair_inputs(const at::Tensor& pd_scores, const at::Tensor& pd_bboxes, const at::Tensor& gt_labels,
                                  const at::Tensor& gt_bboxes) {
  TORCH_CHECK_VALUE(pd_scores.dim() == 3, "pd_scores must be (B, A, C), got ", pd_scores.sizes());
  const int64_t B = pd_scores.size(0), A = pd_scores.size(1), C = pd_scores.size(2);
  TORCH_CHECK_VALUE(
      gt_bboxes.dim() == 3 && (gt_bboxes.size(2) == 4 || gt_bboxes.size(2) == 5) && gt_bboxes.size(0) == B,
      "gt_bboxes must be (B, M, 4) or (B, M, 5) with B = ", B, " (from pd_scores), got ", gt_bboxes.sizes());
  const int64_t M = gt_bboxes.size(1), D = gt_bboxes.size(2);
  TORCH_CHECK_VALUE(pd_bboxes.dim() == 3 && pd_bboxes.size(0) == B && pd_bboxes.size(1) == A && pd_bboxes.size(2) == D,
                    "pd_bboxes must be (B, A, ", D, ") = (", B, ", ", A, ", ", D, "), got ", pd_bboxes.sizes());
  TORCH_CHECK_VALUE(is_rows(gt_labels, B, M), "gt_labels must be (B, M, 1) = (", B, ", ", M, ", 1), got ",
                    gt_labels.sizes());
  const auto box_t = gt_bboxes.scalar_type();
  TORCH_CHECK_TYPE(box_t == at::kFloat || box_t == at::kDouble, "gt_bboxes must be float32 or float64, got ", box_t);
  TORCH_CHECK_TYPE(pd_bboxes.scalar_type() == box_t, "pd_bboxes must have the dtype of gt_bboxes (", box_t, "), got ",
                   pd_bboxes.scalar_type());
  const auto st = pd_scores.scalar_type();
  const bool scores_ok = box_t == at::kFloat ? (st == at::kFloat || st == at::kHalf || st == at::kBFloat16)
                                             : st == at::kDouble;
  TORCH_CHECK_TYPE(scores_ok, "pd_scores must be float32, float16 or bfloat16 with float32 boxes, or float64 with ",
                   "float64 boxes; got ", st, " with ", box_t, " boxes");
  const auto lt = gt_labels.scalar_type();
  TORCH_CHECK_TYPE(c10::isIntegralType(lt, /*includeBool=*/false) || is_float_type(lt),
                   "gt_labels must hold class ids (integer, or float16 to float64), got ", lt);
  check_one_device(pd_scores, {&pd_bboxes, &gt_labels, &gt_bboxes});
  return {B, A, C, M, D};
}

// torch.ops.lucid.pair_overlaps (step 2): returns the box width (4 or 5).
inline int64_t check_pair_overlaps_args(const at::Tensor& gt_bboxes, const at::Tensor& pd_bboxes) {
  TORCH_CHECK_VALUE(gt_bboxes.dim() == 2 && (gt_bboxes.size(1) == 4 || gt_bboxes.size(1) == 5),
                    "gt_bboxes must be (N, 4) or (N, 5), got ", gt_bboxes.sizes());
  TORCH_CHECK_VALUE(pd_bboxes.sizes() == gt_bboxes.sizes(), "pd_bboxes must have the shape of gt_bboxes ",
                    gt_bboxes.sizes(), ", got ", pd_bboxes.sizes());
  TORCH_CHECK_TYPE(gt_bboxes.scalar_type() == at::kFloat || gt_bboxes.scalar_type() == at::kDouble,
                   "gt_bboxes must be float32 or float64, got ", gt_bboxes.scalar_type());
  TORCH_CHECK_TYPE(pd_bboxes.scalar_type() == gt_bboxes.scalar_type(), "pd_bboxes must have the dtype of gt_bboxes (",
                   gt_bboxes.scalar_type(), "), got ", pd_bboxes.scalar_type());
  check_one_device(gt_bboxes, {&pd_bboxes});
  return gt_bboxes.size(1);
}

// torch.ops.lucid.box_metrics (step 2, dense).
inline PairDims check_box_metrics_args(const at::Tensor& pd_scores, const at::Tensor& pd_bboxes,
                                       const at::Tensor& gt_labels, const at::Tensor& gt_bboxes,
                                       const at::Tensor& candidates) {
  const PairDims d = check_pair_inputs(pd_scores, pd_bboxes, gt_labels, gt_bboxes);
  TORCH_CHECK_VALUE(candidates.dim() == 3 && candidates.size(0) == d.B && candidates.size(1) == d.M &&
                        candidates.size(2) == d.A && candidates.scalar_type() == at::kBool,
                    "candidates must be (B, M, A) = (", d.B, ", ", d.M, ", ", d.A, ") bool, got ", candidates.sizes(),
                    " ", candidates.scalar_type());
  check_one_device(pd_scores, {&candidates});
  return d;
}

// torch.ops.lucid.resolve_conflicts (step 4, dense).
inline void check_resolve_conflicts_args(const at::Tensor& mask_pos, const at::Tensor& overlaps) {
  TORCH_CHECK_VALUE(mask_pos.dim() == 3 && mask_pos.scalar_type() == at::kBool, "mask_pos must be (B, M, A) bool, got ",
                    mask_pos.sizes(), " ", mask_pos.scalar_type());
  TORCH_CHECK_VALUE(overlaps.sizes() == mask_pos.sizes(), "overlaps must have the shape of mask_pos ", mask_pos.sizes(),
                    ", got ", overlaps.sizes());
  TORCH_CHECK_TYPE(overlaps.scalar_type() == at::kFloat || overlaps.scalar_type() == at::kDouble,
                   "overlaps must be float32 or float64, got ", overlaps.scalar_type());
  check_one_device(mask_pos, {&overlaps});
}

// torch.ops.lucid.assign (steps 1-6). Label ranges are checked by the backend (the CPU can read them; the GPU must
// not synchronise).
inline PairDims check_assign_args(const at::Tensor& pd_scores, const at::Tensor& pd_bboxes,
                                  const at::Tensor& anc_points, const at::Tensor& gt_labels,
                                  const at::Tensor& gt_bboxes, const at::Tensor& mask_gt, int64_t topk, int64_t topk2,
                                  int64_t num_classes, double stride_val, double eps) {
  const PairDims d = check_pair_inputs(pd_scores, pd_bboxes, gt_labels, gt_bboxes);
  TORCH_CHECK_VALUE(anc_points.dim() == 2 && anc_points.size(0) == d.A && anc_points.size(1) == 2,
                    "anc_points must be (A, 2) with A = ", d.A, ", got ", anc_points.sizes());
  TORCH_CHECK_VALUE(is_rows(mask_gt, d.B, d.M), "mask_gt must be (B, M, 1) = (", d.B, ", ", d.M, ", 1), got ",
                    mask_gt.sizes());
  TORCH_CHECK_VALUE(num_classes == d.C, "num_classes is ", num_classes, " but pd_scores has ", d.C, " classes");
  const auto box_t = gt_bboxes.scalar_type(), anc_t = anc_points.scalar_type();
  TORCH_CHECK_TYPE(anc_t == box_t || (is_float_type(anc_t) && c10::promoteTypes(anc_t, box_t) == box_t),
                   "anc_points must have the dtype of gt_bboxes (", box_t, ") or a narrower float type, got ", anc_t);
  check_one_device(pd_scores, {&anc_points, &mask_gt});
  TORCH_CHECK_VALUE(topk >= 1, "topk must be >= 1, got ", topk);
  TORCH_CHECK_VALUE(topk2 >= 1, "topk2 must be >= 1, got ", topk2);
  TORCH_CHECK_VALUE(d.M == 0 || (topk <= d.A && topk2 <= d.A), "topk (", topk, ") and topk2 (", topk2,
                    ") must not exceed the number of anchors (", d.A, ")");
  TORCH_CHECK_VALUE(std::isfinite(stride_val) && stride_val > 0, "stride_val must be a positive number, got ",
                    stride_val);
  // eps > 0 keeps pa + eps of step 6 positive (with eps <= 0 a row owning nothing would make 0 / 0)
  TORCH_CHECK_VALUE(std::isfinite(eps) && eps > 0, "eps must be a positive number, got ", eps);
  return d;
}

// torch.ops.lucid.assign_pose: the inputs of assign (x1y1x2y2 boxes only) and the pose inputs. Returns K, the
// keypoints per object.
inline int64_t check_assign_pose_args(const PairDims& d, const at::Tensor& pd_scores, const at::Tensor& gt_bboxes,
                                      const at::Tensor& anc_strides, const at::Tensor& pd_kpts,
                                      const at::Tensor& gt_kpts, const at::Tensor& sigmas, double level_lo,
                                      double level_hi) {
  TORCH_CHECK_VALUE(d.D == 4, "assign_pose takes x1y1x2y2 boxes, (B, M, 4); got gt_bboxes ", gt_bboxes.sizes());
  const auto box_t = gt_bboxes.scalar_type();
  TORCH_CHECK_VALUE(anc_strides.dim() == 1 && anc_strides.size(0) == d.A, "anc_strides must be (A,) with A = ", d.A,
                    ", got ", anc_strides.sizes());
  const auto st = anc_strides.scalar_type();
  TORCH_CHECK_TYPE(is_float_type(st) && c10::promoteTypes(st, box_t) == box_t,
                   "anc_strides must have the dtype of gt_bboxes (", box_t, ") or a narrower float type, got ", st);
  TORCH_CHECK_VALUE(gt_kpts.dim() == 4 && gt_kpts.size(0) == d.B && gt_kpts.size(1) == d.M && gt_kpts.size(3) == 3,
                    "gt_kpts must be (B, M, K, 3) = (", d.B, ", ", d.M, ", K, 3), got ", gt_kpts.sizes());
  const int64_t K = gt_kpts.size(2);
  TORCH_CHECK_VALUE(K <= geom::kMaxKeypoints, "gt_kpts: the kernels take at most ", geom::kMaxKeypoints,
                    " keypoints per object, got ", K);
  TORCH_CHECK_VALUE(pd_kpts.dim() == 4 && pd_kpts.size(0) == d.B && pd_kpts.size(1) == d.A && pd_kpts.size(2) == K &&
                        pd_kpts.size(3) == 2,
                    "pd_kpts must be (B, A, K, 2) = (", d.B, ", ", d.A, ", ", K, ", 2), got ", pd_kpts.sizes());
  TORCH_CHECK_TYPE(is_float_type(pd_kpts.scalar_type()),
                   "pd_kpts must be a float16, bfloat16, float32 or float64 tensor, got ", pd_kpts.scalar_type());
  TORCH_CHECK_TYPE(gt_kpts.scalar_type() == box_t, "gt_kpts must have the dtype of gt_bboxes (", box_t, "), got ",
                   gt_kpts.scalar_type());
  TORCH_CHECK_VALUE(sigmas.dim() == 1 && sigmas.size(0) == K, "sigmas must be (K,) = (", K, ",), got ", sigmas.sizes());
  TORCH_CHECK_TYPE(sigmas.scalar_type() == box_t, "sigmas must have the dtype of gt_bboxes (", box_t, "), got ",
                   sigmas.scalar_type());
  TORCH_CHECK_VALUE(std::isfinite(level_lo) && std::isfinite(level_hi), "level_range must be two finite numbers, got (",
                    level_lo, ", ", level_hi, ")");
  check_one_device(pd_scores, {&anc_strides, &pd_kpts, &gt_kpts, &sigmas});
  return K;
}

// torch.ops.lucid.assign_seg: the inputs of assign (x1y1x2y2 boxes only) and the mask inputs (docs/spec.md,
// "Segmentation").
inline void check_assign_seg_args(const PairDims& d, const at::Tensor& pd_scores, const at::Tensor& gt_bboxes,
                                  const at::Tensor& pd_coef, const at::Tensor& mask_scale, const at::Tensor& proto,
                                  const at::Tensor& gt_masks) {
  TORCH_CHECK_VALUE(d.D == 4, "assign_seg takes x1y1x2y2 boxes, (B, M, 4); got gt_bboxes ", gt_bboxes.sizes());
  TORCH_CHECK_VALUE(proto.dim() == 4 && proto.size(0) == d.B, "proto must be (B, nm, mh, mw) with B = ", d.B, ", got ",
                    proto.sizes());
  const int64_t nm = proto.size(1), mh = proto.size(2), mw = proto.size(3);
  TORCH_CHECK_VALUE(pd_coef.dim() == 3 && pd_coef.size(0) == d.B && pd_coef.size(1) == d.A && pd_coef.size(2) == nm,
                    "pd_coef must be (B, A, nm) = (", d.B, ", ", d.A, ", ", nm, "), got ", pd_coef.sizes());
  TORCH_CHECK_TYPE(is_float_type(pd_coef.scalar_type()) && is_float_type(proto.scalar_type()),
                   "pd_coef and proto must be float16, bfloat16, float32 or float64 tensors, got ",
                   pd_coef.scalar_type(), " and ", proto.scalar_type());
  TORCH_CHECK_VALUE((mask_scale.dim() == 2 && mask_scale.size(0) == d.B && mask_scale.size(1) == 1) ||
                        (mask_scale.dim() == 1 && mask_scale.size(0) == d.B),
                    "mask_scale must be (B, 1) = (", d.B, ", 1), got ", mask_scale.sizes());
  const auto st = mask_scale.scalar_type();
  TORCH_CHECK_TYPE(st == at::kFloat || st == at::kDouble, "mask_scale must be float32 or float64, got ", st);
  TORCH_CHECK_VALUE(gt_masks.dim() == 4 && gt_masks.size(0) == d.B && gt_masks.size(1) >= d.M &&
                        gt_masks.size(2) == mh && gt_masks.size(3) == mw,
                    "gt_masks must be (B, >= M, mh, mw) = (", d.B, ", >= ", d.M, ", ", mh, ", ", mw,
                    ") (the prototypes' size), got ", gt_masks.sizes());
  TORCH_CHECK_TYPE(!gt_masks.is_complex(), "gt_masks must be bool or real, got ", gt_masks.scalar_type());
  TORCH_CHECK_VALUE(mh * mw <= geom::kMaxMaskPixels, "proto: at most ", geom::kMaxMaskPixels,
                    " mask pixels (exact float32 counts), got ", mh, " x ", mw);
  check_one_device(pd_scores, {&pd_coef, &mask_scale, &proto, &gt_masks});
}

// torch.ops.lucid.linear_sum_assignment: a cost (R, C) or a batch (B, R, C) of float costs, and the valid columns of
// each problem of a batch (sizes, B integers, on the CPU or on the cost's device). Sizes on the CPU are checked here;
// sizes on the GPU are checked by the kernel, which reports a size out of range in `info` (lsap.h) rather than
// synchronise. The values of the cost are the solver's to judge (NaN, -inf, infeasible: `info`).
struct LsapDims {
  int64_t B, R, C, K;  // problems, rows, columns, pairs per problem at most (min(R, C))
  bool batched;
};

inline LsapDims check_linear_sum_assignment_args(const at::Tensor& cost, const std::optional<at::Tensor>& sizes) {
  TORCH_CHECK_VALUE(cost.dim() == 2 || cost.dim() == 3, "cost must be a matrix (R, C) or a batch of them (B, R, C), ",
                    "got ", cost.dim(), " dimensions ", cost.sizes());
  TORCH_CHECK_TYPE(is_float_type(cost.scalar_type()),
                   "cost must be float32 or float64 (float16 and bfloat16 are widened exactly), got ",
                   cost.scalar_type());
  const bool batched = cost.dim() == 3;
  const int64_t B = batched ? cost.size(0) : 1, R = cost.size(-2), C = cost.size(-1);
  TORCH_CHECK_VALUE(R <= lsap::kMaxSide && C <= lsap::kMaxSide, "cost: at most ", lsap::kMaxSide,
                    " rows and columns, got ", cost.sizes());
  if (sizes.has_value()) {
    const auto& s = *sizes;
    TORCH_CHECK_VALUE(batched, "sizes applies to a batch of costs (B, R, C); cost is a matrix ", cost.sizes());
    TORCH_CHECK_TYPE(c10::isIntegralType(s.scalar_type(), /*includeBool=*/false),
                     "sizes must hold integers (the valid columns of each problem), got ", s.scalar_type());
    TORCH_CHECK_VALUE(s.dim() == 1 && s.size(0) == B, "sizes must be (B,) = (", B, ",), one per problem, got ",
                      s.sizes());
    TORCH_CHECK_VALUE(s.device() == cost.device() || s.is_cpu(), "sizes must be on the CPU or on the device of cost (",
                      cost.device(), "), got ", s.device());
    if (s.is_cpu()) {
      const auto v = s.to(at::kLong).contiguous();
      const int64_t* p = v.data_ptr<int64_t>();
      for (int64_t b = 0; b < B; ++b) {
        TORCH_CHECK_VALUE(p[b] >= 0 && p[b] <= C, "sizes[", b, "] must be in [0, C] = [0, ", C, "], got ", p[b]);
      }
    }
  }
  return {B, R, C, std::min(R, C), batched};
}

// torch.ops.lucid.detr_cost: pred_bboxes (B, Q, 4) and pred_scores (B, Q, C) float, gt_bboxes (N, 4) float and gt_cls
// (N,) integers (the batch's objects, image after image), sizes (B,) integers on the same device (the objects of each
// image), width >= 0 (the output's columns), three gains, gamma >= 0 and l1_order 0 or 1 (detr_cost.h's L1Order). Sizes
// on the CPU are checked here; on the GPU a column without a valid object (its index past N, or its class outside
// [0, C)) gets a NaN cost instead, which the solver refuses.
struct DetrCostDims {
  int64_t B, Q, C, N, W;
};

inline DetrCostDims check_detr_cost_args(const at::Tensor& pred_bboxes, const at::Tensor& pred_scores,
                                         const at::Tensor& gt_bboxes, const at::Tensor& gt_cls, const at::Tensor& sizes,
                                         int64_t width, c10::ArrayRef<double> gains, double gamma, int64_t l1_order) {
  TORCH_CHECK_VALUE(pred_scores.dim() == 3, "pred_scores must be (B, Q, C), got ", pred_scores.sizes());
  const int64_t B = pred_scores.size(0), Q = pred_scores.size(1), C = pred_scores.size(2);
  TORCH_CHECK_VALUE(pred_bboxes.dim() == 3 && pred_bboxes.size(0) == B && pred_bboxes.size(1) == Q &&
                        pred_bboxes.size(2) == 4,
                    "pred_bboxes must be (B, Q, 4) = (", B, ", ", Q, ", 4) (cx, cy, w, h), got ", pred_bboxes.sizes());
  TORCH_CHECK_VALUE(gt_bboxes.dim() == 2 && gt_bboxes.size(1) == 4, "gt_bboxes must be (N, 4) (cx, cy, w, h), got ",
                    gt_bboxes.sizes());
  const int64_t N = gt_bboxes.size(0);
  TORCH_CHECK_VALUE(gt_cls.dim() == 1 && gt_cls.size(0) == N, "gt_cls must be (N,) = (", N,
                    ",), one class per object, got ", gt_cls.sizes());
  TORCH_CHECK_VALUE(sizes.dim() == 1 && sizes.size(0) == B, "sizes must be (B,) = (", B,
                    ",), the objects of each image, got ", sizes.sizes());
  for (const auto* t : {&pred_scores, &pred_bboxes, &gt_bboxes}) {
    TORCH_CHECK_TYPE(is_float_type(t->scalar_type()),
                     "pred_scores, pred_bboxes and gt_bboxes must be float16, bfloat16, float32 or float64, got ",
                     t->scalar_type());
  }
  TORCH_CHECK_TYPE(c10::isIntegralType(gt_cls.scalar_type(), /*includeBool=*/false),
                   "gt_cls must hold integers (class indices), got ", gt_cls.scalar_type());
  TORCH_CHECK_TYPE(c10::isIntegralType(sizes.scalar_type(), /*includeBool=*/false),
                   "sizes must hold integers (the objects of each image), got ", sizes.scalar_type());
  TORCH_CHECK_VALUE(width >= 0, "width must be >= 0 (the cost's columns), got ", width);
  TORCH_CHECK_VALUE(gains.size() == 3, "gains must be 3 numbers (class, bbox, giou), got ", gains.size());
  TORCH_CHECK_VALUE(std::isfinite(gamma) && gamma >= 0, "gamma must be a finite number >= 0, got ", gamma);
  TORCH_CHECK_VALUE(l1_order == 0 || l1_order == 1,
                    "l1_order must be 0 (in turn) or 1 ((dx + dw) + (dy + dh)), got ", l1_order);
  check_one_device(pred_scores, {&pred_bboxes, &gt_bboxes, &gt_cls, &sizes});
  if (sizes.is_cpu()) {
    const auto v = sizes.to(at::kLong).contiguous();
    const int64_t* p = v.data_ptr<int64_t>();
    int64_t total = 0;
    for (int64_t b = 0; b < B; ++b) {
      TORCH_CHECK_VALUE(p[b] >= 0, "sizes[", b, "] must be >= 0, got ", p[b]);
      total += p[b];
    }
    TORCH_CHECK_VALUE(total == N, "sizes must add up to N = ", N, " (gt_bboxes' objects), got ", total);
  }
  return {B, Q, C, N, width};
}

// torch.ops.lucid.detr_cost.family: scores (L, B, Q, C) and boxes (L, B, Q, 4) float (any strides), labels (N,)
// integers and objects (N, 4) float (the batch's objects, image after image), sizes (B,) integers on the same device,
// width >= 1, groups >= 1 dividing Q, three gains, class_term 0 or 1, gamma >= 0, l1_order 0 or 1, nine dtype codes
// (detr_cost.h's DtypeCode) and class_cost, where given, (L, B, Q, width) float. Sizes on the CPU are checked here;
// on the GPU a column without a valid object gets a NaN cost instead (never sanitized), which the solver refuses.
struct FamilyCostDims {
  int64_t L, B, Q, C, N, W, G;
};

inline FamilyCostDims check_family_cost_args(const at::Tensor& scores, const at::Tensor& boxes,
                                             const at::Tensor& labels, const at::Tensor& objects,
                                             const at::Tensor& sizes, int64_t width, int64_t groups,
                                             c10::ArrayRef<double> gains, int64_t class_term, double gamma,
                                             int64_t l1_order, c10::ArrayRef<int64_t> dtypes,
                                             const c10::optional<at::Tensor>& class_cost) {
  TORCH_CHECK_VALUE(scores.dim() == 4, "scores must be (L, B, Q, C), got ", scores.sizes());
  const int64_t L = scores.size(0), B = scores.size(1), Q = scores.size(2), C = scores.size(3);
  TORCH_CHECK_VALUE(boxes.dim() == 4 && boxes.size(0) == L && boxes.size(1) == B && boxes.size(2) == Q &&
                        boxes.size(3) == 4,
                    "boxes must be (L, B, Q, 4) = (", L, ", ", B, ", ", Q, ", 4) (cx, cy, w, h), got ", boxes.sizes());
  TORCH_CHECK_VALUE(objects.dim() == 2 && objects.size(1) == 4, "objects must be (N, 4) (cx, cy, w, h), got ",
                    objects.sizes());
  const int64_t N = objects.size(0);
  TORCH_CHECK_VALUE(labels.dim() == 1 && labels.size(0) == N, "labels must be (N,) = (", N,
                    ",), one class per object, got ", labels.sizes());
  TORCH_CHECK_VALUE(sizes.dim() == 1 && sizes.size(0) == B, "sizes must be (B,) = (", B,
                    ",), the objects of each image, got ", sizes.sizes());
  for (const auto* t : {&scores, &boxes, &objects}) {
    TORCH_CHECK_TYPE(is_float_type(t->scalar_type()) && t->scalar_type() != at::kDouble,
                     "scores, boxes and objects must be float16, bfloat16 or float32, got ", t->scalar_type());
  }
  TORCH_CHECK_TYPE(c10::isIntegralType(labels.scalar_type(), /*includeBool=*/false),
                   "labels must hold integers (class indices), got ", labels.scalar_type());
  TORCH_CHECK_TYPE(c10::isIntegralType(sizes.scalar_type(), /*includeBool=*/false),
                   "sizes must hold integers (the objects of each image), got ", sizes.scalar_type());
  TORCH_CHECK_VALUE(width >= 1, "width must be >= 1 (the cost's columns), got ", width);
  TORCH_CHECK_VALUE(groups >= 1 && Q % groups == 0, "groups must be >= 1 and divide the queries (", Q, "), got ",
                    groups);
  TORCH_CHECK_VALUE(gains.size() == 3, "gains must be 3 numbers (class, bbox, giou), got ", gains.size());
  TORCH_CHECK_VALUE(class_term >= 0 && class_term <= 2,
                    "class_term must be 0 (minus the given probability), 1 (focal) or 2 (RF-DETR's), got ",
                    class_term);
  TORCH_CHECK_VALUE(std::isfinite(gamma) && gamma >= 0, "gamma must be a finite number >= 0, got ", gamma);
  TORCH_CHECK_VALUE(l1_order == 0 || l1_order == 1,
                    "l1_order must be 0 (in turn) or 1 ((dx + dw) + (dy + dh)), got ", l1_order);
  TORCH_CHECK_VALUE(dtypes.size() == 9,
                    "dtypes must be 9 codes (prob, pow, log, cls, l1, pred_corners, gt_corners, pairs, sum), got ",
                    dtypes.size());
  for (const int64_t code : dtypes) {
    TORCH_CHECK_VALUE(code >= 0 && code <= 2, "dtypes must be codes 0 (float32), 1 (bfloat16) or 2 (float16), got ",
                      code);
  }
  check_one_device(scores, {&boxes, &labels, &objects, &sizes});
  if (class_cost.has_value()) {
    const auto& c = *class_cost;
    TORCH_CHECK_VALUE(c.dim() == 4 && c.size(0) == L && c.size(1) == B && c.size(2) == Q && c.size(3) == width,
                      "class_cost must be (L, B, Q, width) = (", L, ", ", B, ", ", Q, ", ", width, "), got ",
                      c.sizes());
    TORCH_CHECK_TYPE(is_float_type(c.scalar_type()), "class_cost must be float, got ", c.scalar_type());
    check_one_device(scores, {&c});
  }
  if (sizes.is_cpu()) {
    const auto v = sizes.to(at::kLong).contiguous();
    const int64_t* p = v.data_ptr<int64_t>();
    int64_t total = 0;
    for (int64_t b = 0; b < B; ++b) {
      TORCH_CHECK_VALUE(p[b] >= 0 && p[b] <= width, "sizes[", b, "] must be in [0, width] = [0, ", width, "], got ",
                        p[b]);
      total += p[b];
    }
    TORCH_CHECK_VALUE(total == N, "sizes must add up to N = ", N, " (the objects), got ", total);
  }
  return {L, B, Q, C, N, width, groups};
}

// detr_cost.parts' class_kind (0 softmax, 1 focal, 2 focal of the object's probability, 3 RF-DETR's, 4 RF-DETR's as
// each layer's forward computes it) as the class term of detr_cost.family that its kernels compute from the scores
// (0 minus the softmax's probability, 1 focal, 2 RF-DETR's).
inline int64_t parts_class_term(int64_t class_kind) { return class_kind == 0 ? 0 : class_kind >= 3 ? 2 : 1; }

// detr_cost.parts' parts as stacks: each (L_p, B, Q, .) as it is, a part of one layer given as (B, Q, .) as
// (1, B, Q, .) (a view).
inline std::vector<at::Tensor> parts_as_stacks(at::TensorList parts) {
  std::vector<at::Tensor> stacks;
  stacks.reserve(parts.size());
  for (const auto& part : parts) stacks.push_back(part.dim() == 3 ? part.unsqueeze(0) : part);
  return stacks;
}

// detr_cost.parts: several stacks (parts) of one loss call, each (L_p, B, Q, .) with its own 9 dtype codes, against
// the same objects; each part checked as detr_cost.family's stack is (with its class term parts_class_term). Returns
// each part's dims.
inline std::vector<FamilyCostDims> check_family_parts_args(at::TensorList scores, at::TensorList boxes,
                                                           const at::Tensor& labels, const at::Tensor& objects,
                                                           const at::Tensor& sizes, int64_t width, int64_t groups,
                                                           c10::ArrayRef<double> gains, int64_t class_kind,
                                                           double gamma, int64_t l1_order,
                                                           c10::ArrayRef<int64_t> dtypes) {
  const int64_t P = static_cast<int64_t>(scores.size());
  TORCH_CHECK_VALUE(P >= 1, "scores must hold at least one part (an (L, B, Q, C) stack), got none");
  TORCH_CHECK_VALUE(static_cast<int64_t>(boxes.size()) == P, "boxes must hold one (L, B, Q, 4) stack per part of "
                    "scores (", P, "), got ", boxes.size());
  TORCH_CHECK_VALUE(static_cast<int64_t>(dtypes.size()) == 9 * P, "dtypes must be 9 codes per part (", 9 * P,
                    " for ", P, " parts), got ", dtypes.size());
  TORCH_CHECK_VALUE(class_kind >= 0 && class_kind <= 4, "class_kind must be 0 (softmax), 1 (focal), 2 (focal of "
                    "the object's probability), 3 (RF-DETR's) or 4 (RF-DETR's as each layer's forward computes it), "
                    "got ", class_kind);
  std::vector<FamilyCostDims> dims;
  dims.reserve(P);
  for (int64_t p = 0; p < P; ++p) {
    TORCH_CHECK_VALUE(scores[p].dim() == 4, "scores[", p, "] must be (L, B, Q, C) or (B, Q, C), got ",
                      scores[p].sizes());
    if (p > 0) {
      TORCH_CHECK_VALUE(scores[p].size(1) == scores[0].size(1) && scores[p].size(2) == scores[0].size(2),
                        "scores[", p, "] must have the images and queries of scores[0] (", scores[0].size(1), ", ",
                        scores[0].size(2), "), got ", scores[p].sizes());
    }
    dims.push_back(check_family_cost_args(scores[p], boxes[p], labels, objects, sizes, width, groups, gains,
                                          parts_class_term(class_kind), gamma, l1_order, dtypes.slice(9 * p, 9),
                                          c10::nullopt));
  }
  return dims;
}

}  // namespace lucid
