// The fused assignment on the CPU: the problem description every pass reads (Problem) and the working memory the
// passes hand on to each other (Workspace). The passes are the headers beside this one, run in order by assign.cpp.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "assign_io.h"
#include "cpu/containment.h"
#include "cpu/keypoints.h"
#include "cpu/overlap_metric.h"
#include "cpu/row_select.h"
#include "cpu/seg_masks.h"
#include "rules.h"

namespace lucid {
namespace cpu {

template <typename S, typename T>
struct Problem : AssignInputs<S, T> {
  int64_t D, K, K2;
  BoxPrep<T> gvals, pvals;  // per-box values of the overlaps (step 2)
  Regions<T> regions;       // candidate regions (step 1)
  const PoseRows<T>* pose = nullptr;  // the pose assignment: the level gate and the keypoint OKS
  const SegRows<T>* seg = nullptr;    // the segmentation assignment: the chosen pairs' mask IoUs
  bool classic_ciou = false;          // CIoU of releases before 8.4.144 (geometry.h RuleSet)

  // Step 1: anchor a lies in the candidate region of `row` (and, for pose, passes the row's level gate).
  bool inside(int64_t row, int64_t a) const {
    return regions.contains(row, this->anc[2 * a], this->anc[2 * a + 1]) && (pose == nullptr || pose->gate(row, a));
  }
  // ... and the row is a real object.
  bool candidate(int64_t row, int64_t a) const { return this->valid[row] && inside(row, a); }

  // Step 2: the metric of a candidate pair from its overlap. pred = b*A + a.
  T align(int64_t row, int64_t pred, T overlap) const {
    return rules::align_metric<S, T>(this->scores[pred * this->C + this->labels[row]], overlap, this->alpha,
                                     this->beta);
  }

  OverlapBatch<T> overlap_batch() const {
    return OverlapBatch<T>(this->gt, gvals, this->pd, pvals, D, pose, seg, classic_ciou);
  }
  // the box overlaps alone (segmentation: the pairs' choice)
  OverlapBatch<T> box_overlap_batch() const {
    return OverlapBatch<T>(this->gt, gvals, this->pd, pvals, D, nullptr, nullptr, classic_ciou);
  }
};

// What the passes hand on, O(B*M*K + B*A + B*M) in all.
template <typename T>
struct Workspace {
  // step 3: each row's chosen anchors (claims), and per row what step 6 and step 5 need to know about non-finite
  // metrics (rules::row_poisoned): whether a candidate pair has a NaN metric or overlap, and how many have an
  // infinite metric
  std::vector<Entry<T>> claims;  // (B*M*K)
  std::vector<int64_t> claim_n;  // (B*M)
  std::vector<uint8_t> nan_seen;
  std::vector<int64_t> inf_cand;
  // step 4 (and 5): the owner row of each anchor (-1: background) with the metric and overlap of that pair
  std::vector<int64_t> owner;  // (B*A)
  std::vector<T> own_align, own_ov;

  Workspace(int64_t B, int64_t A, int64_t M, int64_t K)
      : claims(B * M * K),
        claim_n(B * M, 0),
        nan_seen(B * M, 0),
        inf_cand(B * M, 0),
        owner(B * A, -1),
        own_align(B * A, T(0)),
        own_ov(B * A, T(0)) {}
};

}  // namespace cpu
}  // namespace lucid
