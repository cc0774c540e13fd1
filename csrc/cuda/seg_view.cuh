// Segmentation on the GPU (docs/spec.md, "Segmentation"): the pairs chosen for a mask IoU (SegChoices, written by the
// row kernels of candidate_topk.cuh with MaskChoicePass) and the IoUs as step 2's overlap reads them (SegView).
#pragma once

#include <cstdint>

namespace lucid {
namespace gpu {

// Per row, the anchors chosen for a mask IoU (k3 slots a row, in the order taken), and per anchor of each image
// whether a row chose it.
struct SegChoices {
  int32_t* n;        // (B*M) chosen pairs of each row (integer atomicAdd)
  int32_t* anchors;  // (B*M*k3)
  int32_t* chosen;   // (B*A) 1 when some row of the image chose the anchor
  int64_t A, M;
  int k3;
  __device__ void put(int64_t row, int32_t a) const {
    const int slot = atomicAdd(&n[row], 1);
    anchors[row * k3 + slot] = a;
    chosen[(row / M) * A + a] = 1;
  }
};

// Per row its chosen anchors in increasing order and their mask IoUs (seg_masks.cuh); a pair not chosen has 0.
struct SegView {
  bool on;
  int k3;
  const int32_t* n;       // (B*M)
  const int32_t* sorted;  // (B*M*k3)
  const float* iou;       // (B*M*k3)
  __device__ float mask_iou(int64_t row, int64_t a) const {
    const int32_t* first = sorted + row * k3;
    int lo = 0, hi = n[row];
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (first[mid] < a) lo = mid + 1;
      else hi = mid;
    }
    return lo < n[row] && first[lo] == a ? iou[row * k3 + lo] : 0.0f;
  }
};

}  // namespace gpu
}  // namespace lucid
