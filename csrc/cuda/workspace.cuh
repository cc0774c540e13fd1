// The working memory of one call of the fused assignment on the GPU: every buffer carved from one allocation of
// the caching allocator, O(B*A + B*M) in all.
#pragma once

#include <cstdint>

#include "cuda/anchor_index.cuh"
#include "cuda/problem.cuh"
#include "cuda/seg_masks.cuh"

namespace lucid {
namespace gpu {

// Offsets into one allocation (16-byte aligned). With a null base it only measures.
class Layout {
 public:
  Layout() = default;
  explicit Layout(uint8_t* base) : base_(base) {}
  template <typename U>
  U* take(int64_t n) {
    off_ = (off_ + 15) / 16 * 16;
    U* p = base_ ? reinterpret_cast<U*>(base_ + off_) : nullptr;
    off_ += n * static_cast<int64_t>(sizeof(U));
    return p;
  }
  int64_t size() const { return off_ > 0 ? off_ : 1; }

 private:
  uint8_t* base_ = nullptr;
  int64_t off_ = 0;
};

// The working buffers of one call: O(B*A + B*M) in all (with a second top-k, 32 more ints per row; for
// segmentation 80 more bytes per pair slot, k3 = min(3K, A) slots per row: the chosen anchors as taken and sorted,
// their pixel counts, their crops and up to kMaxPieces pieces; and 8 bytes per row and top-k slot when the claims are
// merged: UnchosenTop).
template <typename T>
struct Workspace {
  // start at zero (cleared by prepare_kernel: the first zero_words 16-byte words)
  int32_t* medium_n;
  int32_t* medium_next;
  int32_t* big_n;
  int32_t* slow_n;
  int32_t* count;                // claims per anchor (B*A)
  int32_t* claimant;             // (B*A)
  unsigned long long* first;     // (B*A) FirstRows
  int32_t* keep;                 // second top-k survivors (B*A), when topk2 != topk
  int32_t* own_n;                // owned anchors per row (B*M), when topk2 != topk
  RowStats stats;                // (B*M) each
  int32_t* nan_seen;             // (B*M) RowNotes
  int32_t* inf_cand;
  int32_t* img_flag;             // (B)
  // segmentation only (seg_masks.cuh): the counters of the choice's row kernels, the chosen pairs per row and the
  // chosen anchors (per anchor of each image, and their number per image), the chosen pairs' pixel counts
  int32_t* seg_medium_n;
  int32_t* seg_medium_next;
  int32_t* seg_big_n;
  int32_t* seg_n;                  // (B*M)
  int32_t* seg_chosen;             // (B*A)
  int64_t* seg_per_image;          // (B)
  unsigned long long* seg_counts;  // (B*M*k3) SegView::counts
  int32_t* seg_top_n;              // (B*M) UnchosenTop::n, when the claims are merged (seg_claims_kernel)
  int64_t zero_words;
  // written before being read
  uint8_t* regions;
  T* gt;                // (B*M, D) the objects' boxes, contiguous
  T* gvals;  // (B*M, kBoxValues)
  T* pvals;  // (B*A, kBoxValues)
  float* anc;           // (A, 2) the anchors as float32
  int32_t* cell_of_anchor;  // (A)
  Axis* axes;
  int32_t* cell_offsets;
  int32_t* cell_sorted;
  int32_t* medium_rows;
  int32_t* big_rows;
  bool* valid;          // (B*M) mask_gt != 0, when converted by prepare_kernel
  int64_t* labels;      // (B*M) likewise
  int32_t* own_list;   // (B*M*kOwnCap), when topk2 != topk
  int32_t* slow_rows;  // (B*M), when topk2 != topk
  int64_t* owner;
  T* own_align;
  T* own_ov;
  // pose only (level_gate.cuh)
  PoseRow* pose_rows;  // (B*M)
  float* anc_stride;   // (A)
  float* stride_extremes;  // (2)
  // segmentation only: per row its chosen anchors as taken and sorted (B*M*k3), per anchor of an image its slot
  // among the image's chosen anchors and per slot its anchor (B*A), the pixel pieces of the chosen pairs
  int32_t* seg_anchors;
  int32_t* seg_sorted;
  int32_t* seg_slot;
  int32_t* seg_anchor_of;  // (B*A) the anchor of each slot of an image
  int64_t* seg_gt_count;   // (B*M) pixels of each object's mask
  PairCrop* seg_crops;     // (B*M*k3) each chosen pair's crop (pairs with pixels in it)
  int32_t* seg_pieces;     // (B*M*k3*kMaxPieces) the pieces of each image's chosen pairs, listed by image
  int32_t* seg_piece_n;    // (B) pieces per image
  int32_t* seg_top_anchor;  // (B*M*K) UnchosenTop, when the claims are merged
  uint32_t* seg_top_key;

  // merge_k: K when the segmentation's claims are merged (seg_claims_kernel), else 0
  void carve(Layout& L, int64_t B, int64_t A, int64_t M, bool second, int64_t D, bool pose = false, int64_t k3 = 0,
             int64_t merge_k = 0) {
    const bool seg = k3 > 0;
    medium_n = L.take<int32_t>(1);
    medium_next = L.take<int32_t>(1);
    big_n = L.take<int32_t>(1);
    slow_n = L.take<int32_t>(1);
    count = L.take<int32_t>(B * A);
    claimant = L.take<int32_t>(B * A);
    first = L.take<unsigned long long>(B * A);
    keep = L.take<int32_t>(second ? B * A : 0);
    own_n = L.take<int32_t>(second ? B * M : 0);
    stats.best_align = L.take<uint32_t>(B * M);
    stats.best_ov = L.take<uint32_t>(B * M);
    stats.owned = L.take<int32_t>(B * M);
    stats.inf_owned = L.take<int32_t>(B * M);
    nan_seen = L.take<int32_t>(B * M);
    inf_cand = L.take<int32_t>(B * M);
    img_flag = L.take<int32_t>(B);
    seg_medium_n = L.take<int32_t>(seg ? 1 : 0);
    seg_medium_next = L.take<int32_t>(seg ? 1 : 0);
    seg_big_n = L.take<int32_t>(seg ? 1 : 0);
    seg_n = L.take<int32_t>(seg ? B * M : 0);
    seg_chosen = L.take<int32_t>(seg ? B * A : 0);
    seg_per_image = L.take<int64_t>(seg ? B : 0);
    seg_counts = L.take<unsigned long long>(B * M * k3);
    seg_top_n = L.take<int32_t>(merge_k > 0 ? B * M : 0);
    zero_words = (L.size() + 15) / 16;  // the next buffer starts past them (take aligns to 16)
    regions = L.take<uint8_t>(B * M * static_cast<int64_t>(D == 4 ? sizeof(geom::HbbRegion<T>)
                                                                 : sizeof(geom::ObbRegion<T>)));
    gt = L.take<T>(B * M * D);
    gvals = L.take<T>(B * M * kBoxValues);
    pvals = L.take<T>(B * A * kBoxValues);
    anc = L.take<float>(A * 2);
    cell_of_anchor = L.take<int32_t>(A);
    axes = L.take<Axis>(2);
    cell_offsets = L.take<int32_t>(kCells * kCells + 1);
    cell_sorted = L.take<int32_t>(A);
    medium_rows = L.take<int32_t>(B * M);
    big_rows = L.take<int32_t>(B * M);
    valid = L.take<bool>(B * M);
    labels = L.take<int64_t>(B * M);
    own_list = L.take<int32_t>(second ? B * M * kOwnCap : 0);
    slow_rows = L.take<int32_t>(second ? B * M : 0);
    owner = L.take<int64_t>(B * A);
    own_align = L.take<T>(B * A);
    own_ov = L.take<T>(B * A);
    pose_rows = L.take<PoseRow>(pose ? B * M : 0);
    anc_stride = L.take<float>(pose ? A : 0);
    stride_extremes = L.take<float>(pose ? 2 : 0);
    seg_anchors = L.take<int32_t>(B * M * k3);
    seg_sorted = L.take<int32_t>(B * M * k3);
    seg_slot = L.take<int32_t>(seg ? B * A : 0);
    seg_anchor_of = L.take<int32_t>(seg ? B * A : 0);
    seg_gt_count = L.take<int64_t>(seg ? B * M : 0);
    seg_crops = L.take<PairCrop>(B * M * k3);
    seg_pieces = L.take<int32_t>(B * M * k3 * kMaxPieces);
    seg_piece_n = L.take<int32_t>(seg ? B : 0);
    seg_top_anchor = L.take<int32_t>(B * M * merge_k);
    seg_top_key = L.take<uint32_t>(B * M * merge_k);
  }
};


}  // namespace gpu
}  // namespace lucid
