// The one place that declares the schemas of the `lucid` operator namespace.
// Backends register implementations in cpu/*.cpp (CPU) and cuda/*.cu (CUDA), one file per op; fake (meta) kernels
// live in lucid_assign/ops.py next to the Python wrappers that document each op. Steps are those of docs/spec.md.
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <tuple>

#include "amp.h"

TORCH_LIBRARY(lucid, m) {
  // Step 1 (docs/spec.md): (B, M, A) bool, true where anchor a lies in the candidate region of box m of image b.
  // gt_bboxes (B, M, 4) x1y1x2y2 or (B, M, 5) cx,cy,w,h,angle; anc_points (A, 2); mask_gt (B, M, 1) or (B, M),
  // nonzero for real objects (only those get the stride_val side floor). The mask is not applied to the result.
  m.def("points_in_boxes(Tensor anc_points, Tensor gt_bboxes, Tensor mask_gt, float stride_val) -> Tensor");

  // Step 2, overlap of paired boxes: gt_bboxes and pd_bboxes (N, 4) -> CIoU, (N, 5) -> probiou; (N,), >= 0.
  m.def("pair_overlaps(Tensor gt_bboxes, Tensor pd_bboxes) -> Tensor");

  // Step 2, dense: for each candidate pair (candidates (B, M, A) bool), the class score of the object's label,
  // the overlap o and align = s^alpha * o^beta; 0 elsewhere. Returns (align_metric, overlaps), each (B, M, A).
  m.def(
      "box_metrics(Tensor pd_scores, Tensor pd_bboxes, Tensor gt_labels, Tensor gt_bboxes, Tensor candidates, "
      "float alpha, float beta) -> (Tensor, Tensor)");

  // Step 4, dense: an anchor positive (mask_pos (B, M, A) bool) for several objects keeps only the object with
  // the largest overlap over all M rows (ties to the lower row). Returns the new (B, M, A) mask.
  m.def("resolve_conflicts(Tensor mask_pos, Tensor overlaps) -> Tensor");

  // The whole assignment, steps 1-6, without any (B, M, A) tensor. Returns (target_labels, target_bboxes,
  // target_scores, fg_mask, target_gt_idx).
  m.def(
      "assign(Tensor pd_scores, Tensor pd_bboxes, Tensor anc_points, Tensor gt_labels, Tensor gt_bboxes, "
      "Tensor mask_gt, int topk, int topk2, int num_classes, float alpha, float beta, float eps, float stride_val) "
      "-> (Tensor, Tensor, Tensor, Tensor, Tensor)");

  // The pose assignment (docs/spec.md, "Pose"): assign for x1y1x2y2 boxes, with step 1 gated by pyramid level
  // (anc_strides (A,), object side between level_lo and level_hi strides) and the keypoint OKS as step 2's overlap
  // (pd_kpts (B, A, K, 2), gt_kpts (B, M, K, 3), sigmas (K,)); objects without visible keypoints keep the CIoU.
  m.def(
      "assign_pose(Tensor pd_scores, Tensor pd_bboxes, Tensor anc_points, Tensor gt_labels, Tensor gt_bboxes, "
      "Tensor mask_gt, Tensor anc_strides, Tensor pd_kpts, Tensor gt_kpts, Tensor sigmas, int topk, int topk2, "
      "int num_classes, float alpha, float beta, float eps, float stride_val, float level_lo, float level_hi) "
      "-> (Tensor, Tensor, Tensor, Tensor, Tensor)");

  // The segmentation assignment (docs/spec.md, "Segmentation"): assign for x1y1x2y2 boxes whose step 2 overlap is the
  // mean of the box overlap and the IoU of the object's mask (gt_masks (B, >= M, mh, mw), nonzero inside) with the
  // anchor's predicted mask (pd_coef (B, A, nm) times proto (B, nm, mh, mw), > 0, cropped to the predicted box scaled
  // by mask_scale (B, 1)), for each object's min(3 * topk, A) best pairs by box metric; 0 for the others. It
  // synchronises once with the device (the decode's shapes depend on the pairs chosen).
  m.def(
      "assign_seg(Tensor pd_scores, Tensor pd_bboxes, Tensor anc_points, Tensor gt_labels, Tensor gt_bboxes, "
      "Tensor mask_gt, Tensor pd_coef, Tensor mask_scale, Tensor proto, Tensor gt_masks, int topk, int topk2, "
      "int num_classes, float alpha, float beta, float eps, float stride_val) -> (Tensor, Tensor, Tensor, Tensor, "
      "Tensor)");
}

// The assignment produces targets, not something to differentiate: the outputs are constants. A fallthrough at the
// Autograd key sends every call straight to the backend kernel, so inputs that require grad are accepted and the
// outputs do not require grad.
TORCH_LIBRARY_IMPL(lucid, Autograd, m) {
  for (const char* op :
       {"points_in_boxes", "pair_overlaps", "box_metrics", "resolve_conflicts", "assign", "assign_pose",
        "assign_seg"}) {
    m.impl(op, torch::CppFunction::makeFallthrough());
  }
}

// CUDA autocast runs `pow` in float32 (amp.h): the ops that take the power of the scores (assign, assign_pose,
// box_metrics) see float16/bfloat16 scores as widened exactly, so that every backend computes what the reference
// computes in the same context. box_metrics is given widened scores; assign and assign_pose are forwarded with the
// flag of amp.h, which their CUDA kernel reads (the same values, without a float32 copy of the scores). CPU autocast
// leaves pow in the input dtype and needs nothing. assign_seg is also forwarded with autocast's matmul dtype (amp.h),
// which the decode of its masks applies as autocast would.
namespace {

bool narrow_cuda_scores(const at::Tensor& s) {
  const auto t = s.scalar_type();
  return (t == at::kHalf || t == at::kBFloat16) && s.is_cuda();
}

at::Tensor widen_scores(const at::Tensor& s) { return narrow_cuda_scores(s) ? s.to(at::kFloat) : s; }

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> assign_autocast(
    const at::Tensor& pd_scores, const at::Tensor& pd_bboxes, const at::Tensor& anc_points, const at::Tensor& gt_labels,
    const at::Tensor& gt_bboxes, const at::Tensor& mask_gt, int64_t topk, int64_t topk2, int64_t num_classes,
    double alpha, double beta, double eps, double stride_val) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCUDA);
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("lucid::assign", "")
                             .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
                                 const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                 const at::Tensor&, const at::Tensor&, int64_t, int64_t, int64_t, double, double,
                                 double, double)>();
  const lucid::ScoresPowInFloat32 flag(narrow_cuda_scores(pd_scores));
  return op.call(pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt, topk, topk2, num_classes, alpha,
                 beta, eps, stride_val);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> assign_pose_autocast(
    const at::Tensor& pd_scores, const at::Tensor& pd_bboxes, const at::Tensor& anc_points, const at::Tensor& gt_labels,
    const at::Tensor& gt_bboxes, const at::Tensor& mask_gt, const at::Tensor& anc_strides, const at::Tensor& pd_kpts,
    const at::Tensor& gt_kpts, const at::Tensor& sigmas, int64_t topk, int64_t topk2, int64_t num_classes,
    double alpha, double beta, double eps, double stride_val, double level_lo, double level_hi) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCUDA);
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("lucid::assign_pose", "")
                             .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
                                 const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                 const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                 const at::Tensor&, const at::Tensor&, int64_t, int64_t, int64_t, double, double,
                                 double, double, double, double)>();
  const lucid::ScoresPowInFloat32 flag(narrow_cuda_scores(pd_scores));
  return op.call(pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt, anc_strides, pd_kpts, gt_kpts,
                 sigmas, topk, topk2, num_classes, alpha, beta, eps, stride_val, level_lo, level_hi);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> assign_seg_autocast(
    const at::Tensor& pd_scores, const at::Tensor& pd_bboxes, const at::Tensor& anc_points, const at::Tensor& gt_labels,
    const at::Tensor& gt_bboxes, const at::Tensor& mask_gt, const at::Tensor& pd_coef, const at::Tensor& mask_scale,
    const at::Tensor& proto, const at::Tensor& gt_masks, int64_t topk, int64_t topk2, int64_t num_classes,
    double alpha, double beta, double eps, double stride_val) {
  const auto matmul_dtype = at::autocast::get_autocast_dtype(at::kCUDA);
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCUDA);
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("lucid::assign_seg", "")
                             .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
                                 const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                 const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                 const at::Tensor&, const at::Tensor&, int64_t, int64_t, int64_t, double, double,
                                 double, double)>();
  const lucid::ScoresPowInFloat32 flag(narrow_cuda_scores(pd_scores));
  const lucid::AutocastMatmulDtype matmul(matmul_dtype);
  return op.call(pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt, pd_coef, mask_scale, proto, gt_masks,
                 topk, topk2, num_classes, alpha, beta, eps, stride_val);
}

std::tuple<at::Tensor, at::Tensor> box_metrics_autocast(const at::Tensor& pd_scores, const at::Tensor& pd_bboxes,
                                                        const at::Tensor& gt_labels, const at::Tensor& gt_bboxes,
                                                        const at::Tensor& candidates, double alpha, double beta) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCUDA);
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("lucid::box_metrics", "")
                             .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                                       const at::Tensor&, const at::Tensor&,
                                                                       const at::Tensor&, double, double)>();
  return op.call(widen_scores(pd_scores), pd_bboxes, gt_labels, gt_bboxes, candidates, alpha, beta);
}

}  // namespace

TORCH_LIBRARY_IMPL(lucid, AutocastCUDA, m) {
  m.impl("assign", &assign_autocast);
  m.impl("assign_pose", &assign_pose_autocast);
  m.impl("assign_seg", &assign_seg_autocast);
  m.impl("box_metrics", &box_metrics_autocast);
  for (const char* op : {"points_in_boxes", "pair_overlaps", "resolve_conflicts"}) {
    m.impl(op, torch::CppFunction::makeFallthrough());
  }
}
