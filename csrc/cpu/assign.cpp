// torch.ops.lucid.assign on the CPU: the steps of docs/spec.md without any (B, M, A) tensor. The passes, in the
// headers beside this file, run one after another, each parallel over rows, images or anchors:
//   candidate_topk.h  steps 1-3  each real row: containment, overlap and metric of the anchors inside, its top K
//                                with the zero fill -> claims (B*M*K) and per-row notes on non-finite metrics
//   conflicts.h       step 4     per anchor: its claimant, or the first row with the largest overlap over all M rows
//                                -> owner, metric and overlap (B*A)
//   second_topk.h     step 5     (K2 != K) each row keeps the K2 best of what it owns -> owner
//   targets.h         step 6     per row the maxima over what it owns (B*M), then per anchor the outputs
// Working memory beyond the outputs: O(B*M*K + B*A + B*M) (problem.h), and per-box values (B*M + B*A).
// assign_pose adds the level gate and the keypoint OKS (keypoints.h), and a float32 copy of non-float32 pd_kpts.
// assign_seg adds, before them, the choice of the pairs that get a mask IoU and those IoUs (seg_masks.h).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include <algorithm>

#include "assign_io.h"
#include "checks.h"
#include "entries.h"
#include "cpu/candidate_topk.h"
#include "cpu/conflicts.h"
#include "cpu/problem.h"
#include "cpu/second_topk.h"
#include "cpu/targets.h"

namespace lucid {
namespace cpu {
namespace {

Outputs5 run(const PairDims& d, const at::Tensor& pd_scores, const at::Tensor& pd_bboxes, const at::Tensor& anc_points,
             const at::Tensor& gt_labels, const at::Tensor& gt_bboxes, const at::Tensor& mask_gt, int64_t topk,
             int64_t topk2, int64_t num_classes, double alpha, double beta, double eps,
             const geom::RuleSet<double>& rule, const PoseArgs* pose_args, const SegArgs* seg_args,
             const AutocastDtype& /*autocast_dtype: CPU autocast changes nothing here (amp.h); seg_args has it*/) {
  const int64_t B = d.B, A = d.A, C = d.C, M = d.M, D = d.D;
  const auto box_t = gt_bboxes.scalar_type();
  const auto out = AssignOutputs::make(d, pd_scores.options(), box_t, num_classes, /*zero_scores=*/true);
  if (M == 0) return out.tuple();
  const auto valid = mask_gt.reshape({B, M}).ne(0).contiguous();
  const auto labels = gt_labels.reshape({B, M}).to(at::kLong).contiguous();
  {
    auto bad = (labels < 0) | (labels >= C);
    if (gt_labels.is_floating_point()) bad |= gt_labels.reshape({B, M}).isnan();
    bad &= valid;
    TORCH_CHECK_VALUE(!bad.any().item<bool>(), "gt_labels: real objects (mask_gt != 0) must have labels in [0, ", C,
                      "); found ", labels.masked_select(bad).slice(0, 0, 5), " (first five)");
  }
  const auto scores = pd_scores.contiguous();
  // anchors of a narrower float type (checked) widen exactly
  const auto pd = pd_bboxes.contiguous(), gt = gt_bboxes.contiguous();
  const auto anc = anc_points.to(gt_bboxes.scalar_type()).contiguous();
  AT_DISPATCH_FLOATING_TYPES(box_t, "assign_cpu", [&] {
    using T = scalar_t;
    PoseRows<T> pose;
    if (pose_args != nullptr) {
      pose = PoseRows<T>::make(gt, pose_args->anc_strides, pose_args->pd_kpts, pose_args->gt_kpts,
                               pose_args->sigmas, eps, pose_args->level_lo, pose_args->level_hi);
    }
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, scores.scalar_type(), "assign_cpu_scores", [&] {
      using S = scalar_t;
      Problem<S, T> P{{scores.data_ptr<S>(), pd.data_ptr<T>(), anc.data_ptr<T>(), gt.data_ptr<T>(),
                       labels.data_ptr<int64_t>(), valid.data_ptr<bool>(), B, A, C, M, alpha, beta,
                       static_cast<T>(eps)},
                      D,
                      topk,
                      topk2,
                      BoxPrep<T>::make(gt),
                      BoxPrep<T>::make(pd),
                      Regions<T>::make(gt, valid.data_ptr<bool>(), geom::rule_as<T>(rule))};
      P.classic_ciou = rule.classic_ciou;
      if (pose_args != nullptr) {
        // step 1's gate applies to a row when an anchor inside its region passes it (rule set 8.4.180: never)
        pose.mean = rule.pose_mean;
        if (pose.mean) {
          pose.gated.assign(B * M, 0);
        } else {
          pose.find_gated(B * M, A, P.valid, [&](int64_t row, int64_t a) {
            return P.regions.contains(row, P.anc[2 * a], P.anc[2 * a + 1]);
          });
        }
        P.pose = &pose;
      }
      SegRows<T> seg;
      if (seg_args != nullptr) {  // step 2 for segmentation: the chosen pairs and their mask IoUs
        seg.M = M;
        seg.A = A;
        seg.K3 = seg_args->k3;
        seg.n.assign(B * M, 0);
        seg.anchors.assign(B * M * seg.K3, 0);
        seg.iou.assign(B * M * seg.K3, T(0));
        choose_mask_pairs(P, seg);
        count_mask_ious(seg, *seg_args, P.pd, B);
        P.seg = &seg;
      }
      Workspace<T> w(B, A, M, topk);
      candidate_topk(P, w);
      resolve_owners(P, w);
      if (topk2 != topk) second_topk(P, w);
      targets(P, w,
              Outputs<T>{out.labels.data_ptr<int64_t>(), out.boxes.data_ptr<T>(), out.scores.data_ptr<T>(),
                         out.fg.data_ptr<bool>(), out.gt_idx.data_ptr<int64_t>()});
    });
  });
  return out.tuple();
}

}  // namespace

TORCH_LIBRARY_IMPL(lucid, CPU, m) { Entries<run>::register_in(m); }

}  // namespace cpu
}  // namespace lucid
