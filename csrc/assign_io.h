// The inputs and outputs of the fused assignment, as both backends hold them: AssignInputs is the part of each
// backend's Problem that describes the call (raw pointers and sizes, usable on the device), AssignOutputs the five
// output tensors.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <tuple>

#include "amp.h"
#include "checks.h"

namespace lucid {

template <typename S, typename T>
struct AssignInputs {
  const S* scores;        // (B, A, C) contiguous
  const T* pd;            // (B, A, D)
  const T* anc;           // (A, 2)
  const T* gt;            // (B, M, D)
  const int64_t* labels;  // (B, M)
  const bool* valid;      // (B, M): mask_gt != 0
  int64_t B, A, C, M;
  double alpha, beta;
  T eps;
};

// The pose inputs of assign_pose, checked (check_assign_pose_args: K keypoints), that each backend's assign adds to
// the box inputs; absent (a null pointer) for assign.
struct PoseArgs {
  const at::Tensor& anc_strides;
  const at::Tensor& pd_kpts;
  const at::Tensor& gt_kpts;
  const at::Tensor& sigmas;
  int64_t K;
  double level_lo, level_hi;
};

// The mask inputs of assign_seg, checked (check_assign_seg_args), that each backend's assign adds to the box inputs;
// absent (a null pointer) otherwise. k3: the pairs per object that get a mask IoU, min(3 * topk, A). matmul_dtype: the
// call's autocast region (amp.h), whose dtype the decode's product takes.
struct SegArgs {
  const at::Tensor& pd_coef;
  const at::Tensor& mask_scale;
  const at::Tensor& proto;
  const at::Tensor& gt_masks;
  int64_t k3;
  AutocastDtype matmul_dtype;
};

struct AssignOutputs {
  at::Tensor labels, boxes, scores, fg, gt_idx;

  // The outputs for sizes d on the device of `opts`, boxes and scores of dtype box_t (scores zero-filled when
  // zero_scores). With no object rows (M = 0) they are filled here: every anchor background, labels num_classes,
  // everything else 0.
  static AssignOutputs make(const PairDims& d, const at::TensorOptions& opts, at::ScalarType box_t,
                            int64_t num_classes, bool zero_scores) {
    const int64_t B = d.B, A = d.A;
    AssignOutputs o{at::empty({B, A}, opts.dtype(at::kLong)), at::empty({B, A, d.D}, opts.dtype(box_t)),
                    zero_scores ? at::zeros({B, A, d.C}, opts.dtype(box_t)) : at::empty({B, A, d.C}, opts.dtype(box_t)),
                    at::empty({B, A}, opts.dtype(at::kBool)), at::empty({B, A}, opts.dtype(at::kLong))};
    if (d.M == 0) {
      o.labels.fill_(num_classes);
      o.boxes.zero_();
      if (!zero_scores) o.scores.zero_();
      o.fg.zero_();
      o.gt_idx.zero_();
    }
    return o;
  }

  std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> tuple() const {
    return {labels, boxes, scores, fg, gt_idx};
  }
};

}  // namespace lucid
