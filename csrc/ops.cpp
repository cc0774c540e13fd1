// The one place that declares the schemas of the `lucid` operator namespace.
// Backends register implementations in cpu/*.cpp (CPU) and cuda/*.cu (CUDA), one file per op; fake (meta) kernels
// live in lucid_assign/ops.py next to the Python wrappers that document each op. Steps are those of docs/spec.md.
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

TORCH_LIBRARY(lucid, m) {
  // Step 1 (docs/spec.md): (B, M, A) bool, true where anchor a lies in the candidate region of box m of image b.
  // gt_bboxes (B, M, 4) x1y1x2y2 or (B, M, 5) cx,cy,w,h,angle; anc_points (A, 2); mask_gt (B, M, 1) or (B, M),
  // nonzero for real objects (only those get the stride_val side floor). The mask is not applied to the result.
  // rules, here and in the fused ops: the peer's rule set (docs/spec.md, "Rule sets"; checks.h rule_set), with
  // first_stride the trainer's stride[0] where the rule set needs it.
  m.def(
      "points_in_boxes(Tensor anc_points, Tensor gt_bboxes, Tensor mask_gt, float stride_val, *, "
      "str rules=\"8.4.144\", float? first_stride=None) -> Tensor");

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
  // target_scores, fg_mask, target_gt_idx). autocast_dtype, here and in assign_pose and assign_seg: the autocast
  // region the results are those of (amp.h; None: outside autocast), filled by the autocast kernel below.
  m.def(
      "assign(Tensor pd_scores, Tensor pd_bboxes, Tensor anc_points, Tensor gt_labels, Tensor gt_bboxes, "
      "Tensor mask_gt, int topk, int topk2, int num_classes, float alpha, float beta, float eps, float stride_val, *, "
      "str rules=\"8.4.144\", float? first_stride=None, ScalarType? autocast_dtype=None) "
      "-> (Tensor, Tensor, Tensor, Tensor, Tensor)");

  // The pose assignment (docs/spec.md, "Pose"): assign for x1y1x2y2 boxes, with step 1 gated by pyramid level
  // (anc_strides (A,), object side between level_lo and level_hi strides) and the keypoint OKS as step 2's overlap
  // (pd_kpts (B, A, K, 2), gt_kpts (B, M, K, 3), sigmas (K,)); objects without visible keypoints keep the CIoU.
  m.def(
      "assign_pose(Tensor pd_scores, Tensor pd_bboxes, Tensor anc_points, Tensor gt_labels, Tensor gt_bboxes, "
      "Tensor mask_gt, Tensor anc_strides, Tensor pd_kpts, Tensor gt_kpts, Tensor sigmas, int topk, int topk2, "
      "int num_classes, float alpha, float beta, float eps, float stride_val, float level_lo, float level_hi, *, "
      "str rules=\"8.4.144\", float? first_stride=None, ScalarType? autocast_dtype=None) "
      "-> (Tensor, Tensor, Tensor, Tensor, Tensor)");

  // The segmentation assignment (docs/spec.md, "Segmentation"): assign for x1y1x2y2 boxes whose step 2 overlap is the
  // mean of the box overlap and the IoU of the object's mask (gt_masks (B, >= M, mh, mw), nonzero inside) with the
  // anchor's predicted mask (pd_coef (B, A, nm) times proto (B, nm, mh, mw), > 0, cropped to the predicted box scaled
  // by mask_scale (B, 1)), for each object's min(3 * topk, A) best pairs by box metric; 0 for the others. It
  // synchronises once with the device (the decode's shapes depend on the pairs chosen).
  m.def(
      "assign_seg(Tensor pd_scores, Tensor pd_bboxes, Tensor anc_points, Tensor gt_labels, Tensor gt_bboxes, "
      "Tensor mask_gt, Tensor pd_coef, Tensor mask_scale, Tensor proto, Tensor gt_masks, int topk, int topk2, "
      "int num_classes, float alpha, float beta, float eps, float stride_val, *, str rules=\"8.4.144\", "
      "float? first_stride=None, ScalarType? autocast_dtype=None) "
      "-> (Tensor, Tensor, Tensor, Tensor, Tensor)");

  // The linear sum assignment (docs/spec.md, "Linear sum assignment"): SciPy's linear_sum_assignment of each problem,
  // cost (R, C) or a batch (B, R, C) whose problem b is cost[b, :, :sizes[b]]. Returns (row_ind, col_ind, info):
  // row_ind and col_ind (K,) or (B, K), K = min(R, C), int64, SciPy's pairs of each problem in its order (rows
  // ascending) followed by -1; info () or (B,) int32, 0 where solved, else why not (lsap.h: NaN or -inf in the cost,
  // infeasible, a size out of range), the problem's pairs then all -1. It never raises on the cost's values and never
  // synchronises.
  m.def("linear_sum_assignment(Tensor cost, Tensor? sizes=None) -> (Tensor, Tensor, Tensor)");
  // The same solve, its result by row: (columns, info), columns (R,) or (B, R) int64, the column matched to each row
  // of each problem (-1: none; all -1 where info is not 0), the form of lucid_assign.linear_sum_assignment's batches.
  m.def("linear_sum_assignment.columns(Tensor cost, Tensor? sizes=None) -> (Tensor, Tensor)");

  // The DETR matching cost, the peer's RT-DETR matcher's (docs/spec.md, "DETR matching cost"; detr_cost.h), in one
  // pass: (B, Q, width) float32, entry (b, q, j) the cost of query q of image b against object j of that image
  // (objects image after image in gt_bboxes and gt_cls, sizes[b] of them), or against a zero box of class 0 past the
  // image's objects, as the peer pads them. gains: class, bbox, giou.
  m.def(
      "detr_cost(Tensor pred_bboxes, Tensor pred_scores, Tensor gt_bboxes, Tensor gt_cls, Tensor sizes, int width, "
      "float[] gains, float alpha, float gamma, *, bool sanitize=True, int l1_order=1) -> Tensor");
  // The cost of transformers' DETR-family matchers (docs/spec.md, "DETR family cost"; detr_cost.h's family_cost) for
  // every layer of a loss call at once: scores and boxes (L, B, Q, .), the batch's objects image after image. Returns
  // (cost, invalid): the problems (L * B * groups, Q / groups, width) float32 of linear_sum_assignment, problem
  // (l, b, g) query g * Q / groups + i of image b in layer l against the image's object j (0 past its objects), and
  // invalid (1,) int32, nonzero where some query's or object's corners are not x2 >= x1 and y2 >= y1 (the family
  // raises then). dtypes: the DtypeCode of the probabilities, the focal powers, the focal logs, the class term, the L1,
  // the queries' corners, the objects' corners, the pairwise GIoU terms and the first sum; class_cost, where given, is
  // each entry's class term.
  m.def(
      "detr_cost.family(Tensor scores, Tensor boxes, Tensor labels, Tensor objects, Tensor sizes, int width, "
      "int groups, float[] gains, int class_term, float alpha, float gamma, int l1_order, int[] dtypes, "
      "bool sanitize, float top, Tensor? class_cost=None) -> (Tensor, Tensor)");
  // Their class terms (L, B, Q, width) on the CPU, with the families' own ATen operations on each layer's (B * Q, C)
  // logits (ATen's vectorised CPU math rounds an element by its place in the tensor): kind 0 softmax, 1 focal, 2 focal
  // of the object's probability, 3 RF-DETR's focal of the gathered logits (every layer's at once), 4 RF-DETR's over
  // the cross product (each layer's (B * Q, N) logits at every object's class, as its forward's full cost); labels
  // (N,) the batch's objects' classes image after image, sizes (B,) their counts (class 0 past them, 0 for kind 4).
  // Passed to detr_cost.family as class_cost.
  // Several stacks (parts) of one loss call at once, each (L_p, B, Q, .) (or (B, Q, .) for one layer) of its own dtypes
  // and strides (scores the logits), against the same objects: (cost, invalid) as detr_cost.family's for the parts'
  // layers, part after part. Each part's class term is its family's (class_kind 0 softmax, 1 focal, 2 focal of the
  // object's probability, 3 RF-DETR's, whose boxes are its own too, 4 RF-DETR's as each layer's forward computes it: a
  // part whose boxes are of the objects' dtype as kind 3 a layer at a time, any other over the cross product; on the
  // CPU by class_terms' operations on the part's layers); dtypes: 9 codes per part, in detr_cost.family's order.
  m.def(
      "detr_cost.parts(Tensor[] scores, Tensor[] boxes, Tensor labels, Tensor objects, Tensor sizes, int width, "
      "int groups, float[] gains, int class_kind, float alpha, float gamma, int l1_order, int[] dtypes, "
      "bool sanitize, float top) -> (Tensor, Tensor)");
  m.def(
      "detr_cost.class_terms(Tensor logits, Tensor labels, Tensor sizes, int width, int kind, float alpha, "
      "float gamma) -> Tensor");

  // A trainer's matches from linear_sum_assignment's (layers * P, K) rows and cols: (queries, objects), each
  // (layers * M,) int64, queries the rows of each layer at `pairs` (M places of its P * K, image after image) plus
  // query_offset (M,), objects the cols likewise plus object_offset; implemented once below with ATen operations, for
  // every backend.
  m.def(
      "matches(Tensor rows, Tensor cols, Tensor pairs, Tensor? query_offset, Tensor? object_offset, int layers) "
      "-> (Tensor, Tensor)");
}

// The assignment and the matching produce targets, not something to differentiate: the outputs are constants. A
// fallthrough at the Autograd key sends every call straight to the backend kernel, so inputs that require grad are
// accepted and the outputs do not require grad.
TORCH_LIBRARY_IMPL(lucid, Autograd, m) {
  for (const char* op :
       {"points_in_boxes", "pair_overlaps", "box_metrics", "resolve_conflicts", "assign", "assign_pose",
        "assign_seg", "linear_sum_assignment", "linear_sum_assignment.columns", "detr_cost", "detr_cost.family",
        "detr_cost.class_terms", "detr_cost.parts"}) {
    m.impl(op, torch::CppFunction::makeFallthrough());
  }
}

namespace {

std::tuple<at::Tensor, at::Tensor> matches(const at::Tensor& rows, const at::Tensor& cols, const at::Tensor& pairs,
                                           const c10::optional<at::Tensor>& query_offset,
                                           const c10::optional<at::Tensor>& object_offset, int64_t layers) {
  TORCH_CHECK_VALUE(rows.sizes() == cols.sizes(), "rows and cols must have one shape, got ", rows.sizes(), " and ",
                    cols.sizes());
  TORCH_CHECK_TYPE(
      rows.scalar_type() == at::kLong && cols.scalar_type() == at::kLong && pairs.scalar_type() == at::kLong,
      "rows, cols and pairs must be int64");
  TORCH_CHECK_VALUE(layers >= 1 && rows.numel() % layers == 0, "layers must be >= 1 and divide rows' ", rows.numel(),
                    " entries, got ", layers);
  TORCH_CHECK_VALUE(pairs.dim() == 1, "pairs must be 1-D, got ", pairs.sizes());
  const int64_t M = pairs.numel();
  for (const auto* o : {&query_offset, &object_offset}) {
    if (o->has_value()) {
      TORCH_CHECK_VALUE((*o)->dim() == 1 && (*o)->numel() == M && (*o)->scalar_type() == at::kLong,
                        "query_offset and object_offset must be (M,) = (", M, ",) int64, got ", (*o)->sizes());
    }
  }
  auto take = [&](const at::Tensor& t, const c10::optional<at::Tensor>& offset) {
    auto picked = t.reshape({layers, -1}).index_select(1, pairs);
    if (offset.has_value()) picked.add_(*offset);
    return picked.view(-1);
  };
  return {take(rows, query_offset), take(cols, object_offset)};
}

}  // namespace

TORCH_LIBRARY_IMPL(lucid, CompositeExplicitAutograd, m) { m.impl("matches", &matches); }

// The fused ops take their autocast region as the argument autocast_dtype (amp.h). Their autocast kernel, one boxed
// function for the three ops and both devices, fills it from the region it is called in when the caller left it None
// and forwards the call below autocast, so every backend computes what the reference computes in that region; a
// graph recorded by torch.compile holds the filled argument. box_metrics, a dense pass, is given widened scores
// under CUDA autocast (CPU autocast leaves pow in the input dtype and needs nothing); the other passes fall through.
namespace {

template <c10::DeviceType device, c10::DispatchKey autocast_key>
void autocast_fused(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  const auto& args = op.schema().arguments();
  TORCH_INTERNAL_ASSERT(!args.empty() && args.back().name() == "autocast_dtype", op.schema().name(),
                        ": the last argument must be autocast_dtype");
  auto& region = (*stack)[stack->size() - 1];  // the last argument is on top of the stack
  if (region.isNone()) region = c10::IValue(at::autocast::get_autocast_dtype(device));
  c10::impl::ExcludeDispatchKeyGuard no_autocast(autocast_key);
  op.callBoxed(stack);
}

bool narrow_cuda_scores(const at::Tensor& s) {
  const auto t = s.scalar_type();
  return (t == at::kHalf || t == at::kBFloat16) && s.is_cuda();
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
  const auto scores = narrow_cuda_scores(pd_scores) ? pd_scores.to(at::kFloat) : pd_scores;
  return op.call(scores, pd_bboxes, gt_labels, gt_bboxes, candidates, alpha, beta);
}

constexpr const char* kFusedOps[] = {"assign", "assign_pose", "assign_seg"};
constexpr const char* kPassOps[] = {"points_in_boxes", "pair_overlaps", "resolve_conflicts"};

}  // namespace

TORCH_LIBRARY_IMPL(lucid, AutocastCUDA, m) {
  for (const char* op : kFusedOps) {
    m.impl(op, torch::CppFunction::makeFromBoxedFunction<
                   &autocast_fused<c10::DeviceType::CUDA, c10::DispatchKey::AutocastCUDA>>());
  }
  m.impl("box_metrics", &box_metrics_autocast);
  for (const char* op : kPassOps) m.impl(op, torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(lucid, AutocastCPU, m) {
  for (const char* op : kFusedOps) {
    m.impl(op, torch::CppFunction::makeFromBoxedFunction<
                   &autocast_fused<c10::DeviceType::CPU, c10::DispatchKey::AutocastCPU>>());
  }
}
