// The one place that declares the schemas of the `lucid` operator namespace.
// Backends register implementations in cpu/*.cpp (CPU) and cuda/*.cu (CUDA); fake (meta) kernels live in
// lucid_assign/ops.py next to the Python wrappers that document each op.
#include <torch/library.h>

TORCH_LIBRARY(lucid, m) {
  // SPEC step 1: (B, M, A) bool, true where anchor a lies in the candidate region of box m of image b.
  // gt_bboxes (B, M, 4) x1y1x2y2 or (B, M, 5) cx,cy,w,h,angle; anc_points (A, 2); mask_gt (B, M, 1) or (B, M),
  // nonzero for real objects (only those get the stride_val side floor). The mask is not applied to the result.
  m.def("points_in_boxes(Tensor anc_points, Tensor gt_bboxes, Tensor mask_gt, float stride_val) -> Tensor");

  // SPEC step 2, overlap of paired boxes: gt_bboxes and pd_bboxes (N, 4) -> CIoU, (N, 5) -> probiou; (N,), >= 0.
  m.def("pair_overlaps(Tensor gt_bboxes, Tensor pd_bboxes) -> Tensor");

  // SPEC step 2, dense: for each candidate pair (candidates (B, M, A) bool), the class score of the object's label,
  // the overlap o and align = s^alpha * o^beta; 0 elsewhere. Returns (align_metric, overlaps), each (B, M, A).
  m.def(
      "box_metrics(Tensor pd_scores, Tensor pd_bboxes, Tensor gt_labels, Tensor gt_bboxes, Tensor candidates, "
      "float alpha, float beta) -> (Tensor, Tensor)");

  // SPEC step 4, dense: an anchor positive (mask_pos (B, M, A) bool) for several objects keeps only the object with
  // the largest overlap over all M rows (ties to the lower row). Returns the new (B, M, A) mask.
  m.def("resolve_conflicts(Tensor mask_pos, Tensor overlaps) -> Tensor");

  // The whole assignment, SPEC steps 1-8, without any (B, M, A) tensor. Returns (target_labels, target_bboxes,
  // target_scores, fg_mask, target_gt_idx).
  m.def(
      "assign(Tensor pd_scores, Tensor pd_bboxes, Tensor anc_points, Tensor gt_labels, Tensor gt_bboxes, "
      "Tensor mask_gt, int topk, int topk2, int num_classes, float alpha, float beta, float eps, float stride_val) "
      "-> (Tensor, Tensor, Tensor, Tensor, Tensor)");
}

// The assignment produces targets, not something to differentiate: the outputs are constants. A fallthrough at the
// Autograd key sends every call straight to the backend kernel, so inputs that require grad are accepted and the
// outputs do not require grad.
TORCH_LIBRARY_IMPL(lucid, Autograd, m) {
  for (const char* op : {"points_in_boxes", "pair_overlaps", "box_metrics", "resolve_conflicts", "assign"}) {
    m.impl(op, torch::CppFunction::makeFallthrough());
  }
}
