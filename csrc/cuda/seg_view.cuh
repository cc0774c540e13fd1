// Segmentation on the GPU (docs/spec.md, "Segmentation"): the pairs chosen for a mask IoU (SegChoices, written by the
// row kernels of candidate_topk.cuh with MaskChoicePass) and the IoUs as step 2's overlap reads them (SegView).
#pragma once

#include <cstdint>

#include "geometry.h"

namespace lucid {
namespace gpu {

// Per row, the anchors chosen for a mask IoU (k3 slots a row, in the order taken), per anchor of each image
// whether a row chose it, and per image how many anchors its rows chose (integer atomics, all starting at zero).
struct SegChoices {
  int32_t* n;          // (B*M) chosen pairs of each row
  int32_t* anchors;    // (B*M*k3)
  int32_t* chosen;     // (B*A) 1 when some row of the image chose the anchor
  int64_t* per_image;  // (B) the image's chosen anchors
  int64_t A, M;
  int k3;
  __device__ void put(int64_t row, int32_t a) const {
    const int slot = atomicAdd(&n[row], 1);
    anchors[row * k3 + slot] = a;
    const int64_t b = row / M;
    if (atomicExch(&chosen[b * A + a], 1) == 0) {  // the first row of the image to choose it counts it
      atomicAdd(reinterpret_cast<unsigned long long*>(&per_image[b]), 1ull);
    }
  }
};

// Per row its chosen anchors in increasing order and their pixel counts (seg_masks.cuh): the intersection of each
// chosen pair's cropped predicted mask with the object's mask in the high 32 bits, the cropped mask's pixels in the
// low 32; a pair not chosen has mask IoU 0.
struct SegView {
  bool on;
  int k3;
  const int32_t* n;                  // (B*M)
  const int32_t* sorted;             // (B*M*k3)
  const unsigned long long* counts;  // (B*M*k3)
  const int64_t* gt_count;           // (B*M) the object's mask pixels (rows with chosen pairs)
  // the place of anchor a in the row's sorted list, or -1 when the row did not choose it
  __device__ int slot_of(int64_t row, int64_t a) const {
    const int32_t* first = sorted + row * k3;
    int lo = 0, hi = n[row];
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (first[mid] < a) lo = mid + 1;
      else hi = mid;
    }
    return lo < n[row] && first[lo] == a ? lo : -1;
  }
  __device__ float mask_iou(int64_t row, int64_t a) const {
    const int slot = slot_of(row, a);
    if (slot < 0) return 0.0f;
    const unsigned long long c = counts[row * k3 + slot];
    return geom::mask_iou(static_cast<int64_t>(c >> 32), gt_count[row], static_cast<int64_t>(c & 0xFFFFFFFFull));
  }
};

// Per row, the pairs not chosen for a mask IoU ranked within its first K among its anchors other than the chosen
// (UnchosenPass): at most K a row, in any order, with their metric keys.
struct UnchosenTop {
  int32_t* n;        // (B*M), from zero
  int32_t* anchor;   // (B*M*K)
  uint32_t* key;     // (B*M*K)
  int k;
  __device__ void put(int64_t row, int32_t a, uint32_t key_) const {
    const int slot = atomicAdd(&n[row], 1);
    anchor[row * k + slot] = a;
    key[row * k + slot] = key_;
  }
};

}  // namespace gpu
}  // namespace lucid
