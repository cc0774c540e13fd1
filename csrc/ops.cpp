// The one place that declares the schemas of the `lucid` operator namespace.
// Backends register implementations in cpu/*.cpp (CPU) and cuda/*.cu (CUDA); fake (meta) kernels live in
// lucid_assign/ops.py next to the Python wrappers that document each op.
#include <torch/library.h>

TORCH_LIBRARY(lucid, m) {
  // SPEC step 1: (B, M, A) bool, true where anchor a lies in the candidate region of box m of image b.
  // gt_bboxes (B, M, 4) x1y1x2y2 or (B, M, 5) cx,cy,w,h,angle; anc_points (A, 2); mask_gt (B, M, 1) or (B, M),
  // nonzero for real objects (only those get the stride_val side floor). The mask is not applied to the result.
  m.def("points_in_boxes(Tensor anc_points, Tensor gt_bboxes, Tensor mask_gt, float stride_val) -> Tensor");
}
