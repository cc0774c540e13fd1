// The fused assignment on the GPU: the problem description every pass reads (Problem), the entry of one candidate
// pair with its order key, and the records the passes hand on (RowNotes, Claims, RowStats, OwnerSink).
#pragma once

#include <c10/macros/Macros.h>

#include <cstdint>

#include "assign_io.h"
#include "cuda/containment.cuh"
#include "cuda/keypoints.cuh"
#include "cuda/launch.cuh"
#include "cuda/overlap_metric.cuh"
#include "cuda/seg_view.cuh"
#include "rules.h"

namespace lucid {
namespace gpu {

using rules::kZeroKey;
using rules::order_key;

// A candidate pair's entry with the order key of its metric (rules::order_key), by which the passes rank. Key 0
// (below every metric's key) marks a pair that takes part in no ranking (UnchosenPass).
template <typename T>
struct KeyedEntry : rules::Entry<T, int32_t> {
  uint32_t key;
};

// Per row, what steps 5 and 6 need to know about non-finite metrics (rules::row_poisoned): whether a candidate pair
// has a NaN metric or overlap, and how many have an infinite metric. Each candidate pair is noted exactly once, by
// the step-3 kernel that computes its entry for the list. An image none of whose rows is flagged cannot be
// poisoned: img_flag lets the targets kernel skip the rows of such images.
struct RowNotes {
  int32_t* nan_seen;  // (B*M) 0 or 1
  int32_t* inf_cand;  // (B*M)
  int32_t* img_flag;  // (B) 1 when a row of the image is flagged
  int64_t M;
  template <typename T>
  __device__ void note(int64_t row, T align, T overlap) const {
    const bool nan = align != align || overlap != overlap, inf = isinf(align);
    if (nan) nan_seen[row] = 1;
    if (inf) atomicAdd(&inf_cand[row], 1);
    if (nan || inf) img_flag[row / M] = 1;
  }
  __device__ bool flagged(int64_t row) const { return nan_seen[row] || inf_cand[row]; }
};

// The claims of step 3, per anchor of the image: the number of rows that chose it (integer atomicAdd) and the
// largest of those rows (atomicMax: the claimant when the count is 1).
struct Claims {
  int32_t* count;     // (B*A)
  int32_t* claimant;  // (B*A)
  int64_t A, M;
  __device__ void put(int64_t row, int32_t anchor) const {
    const int64_t p = (row / M) * A + anchor;
    atomicAdd(&count[p], 1);
    atomicMax(&claimant[p], static_cast<int32_t>(row));
  }
};

// Per anchor, the first row with the largest overlap among the rows it is a candidate of: step 4's owner of an
// anchor claimed more than once (rules::FirstMax over all M rows, where the rows it is not a candidate of count 0).
// Every candidate pair offers its overlap once; the largest key wins (integer atomicMax, so the order of the offers
// does not matter): the overlap's order key (NaN above every number, -0 tied with +0) above the row's complement,
// so that of equal overlaps the lower row wins.
struct FirstRows {
  unsigned long long* key;  // (B*A), 0 until a candidate pair offers
  int64_t A, M;
  __device__ void offer(int64_t row, int32_t anchor, float overlap) const {
    atomicMax(&key[(row / M) * A + anchor],
              static_cast<unsigned long long>(rules::row_key(overlap, static_cast<uint32_t>(row % M))));
  }
  // The owner m of anchor p = b*A + a, from at least one offer. When the largest overlap is 0, every one of the M
  // rows has overlap 0 (the candidates' are clamped at 0, the others count 0), so the first maximum is row 0.
  __device__ int64_t first_row(int64_t p) const {
    const uint64_t k = key[p];
    if (rules::value_key_of(k) == kZeroKey) return 0;
    return rules::row_of_key(k);
  }
};

// What steps 1-3 record of every candidate pair, exactly once each, as they compute its entry: the row's notes and
// the anchor's first rows.
struct PairLog {
  RowNotes notes;
  FirstRows first;
  template <typename T>
  __device__ void record(int64_t row, const KeyedEntry<T>& e) const {
    notes.note(row, e.align, e.overlap);
    first.offer(row, e.anchor, e.overlap);
  }
};

// Per row, over the anchors it finally owns: the maxima of metric and overlap (integer atomicMax on order keys, so
// order-independent), how many it owns and how many of those have an infinite metric (step 6).
struct RowStats {
  uint32_t* best_align;  // (B*M); key 0 ranks below every number
  uint32_t* best_ov;
  int32_t* owned;
  int32_t* inf_owned;
  __device__ void add(int64_t row, float align, float ov) const {
    atomicMax(&best_align[row], order_key(align));
    atomicMax(&best_ov[row], order_key(ov));
    atomicAdd(&owned[row], 1);
    if (isinf(align)) atomicAdd(&inf_owned[row], 1);
  }
};

// What step 4 records of each anchor's owner: its row statistics, or, when a second top-k follows (which decides
// what the rows finally own), the anchor in the row's list of owned anchors (kOwnCap slots; list_n counts them all).
constexpr int kOwnCap = 32;

struct OwnerSink {
  RowStats stats;
  int32_t* list_n;  // (B*M), null without a second top-k
  int32_t* list;    // (B*M*kOwnCap)
  __device__ void add(int64_t row, int64_t a, float align, float ov) const {
    if (list_n == nullptr) {
      stats.add(row, align, ov);
      return;
    }
    const int slot = atomicAdd(&list_n[row], 1);  // the order within a row does not matter: ranks are computed
    if (slot < kOwnCap) list[row * kOwnCap + slot] = static_cast<int32_t>(a);
  }
};

// Per-box values prepared by prepare_kernel: per object row its candidate region and the values of its overlaps,
// per prediction the values of its overlaps (kBoxValues each).
template <typename T>
struct Prep {
  Regions<T> regions;
  const T* gvals;  // (B*M, kBoxValues)
  const T* pvals;  // (B*A, kBoxValues)
};

// The problem description every kernel of the fused assignment reads.
template <typename S, typename T>
struct Problem : AssignInputs<S, T> {
  int D, K;  // K2 goes to the second top-k kernels as an argument
  Prep<T> prep;
  bool pow_wide;  // s^alpha as for scores widened to float32 (CUDA autocast, amp.h)
  PoseView pose;  // the pose assignment: the level gate and the keypoint OKS (pose.on)
  SegView seg;    // the segmentation assignment: the chosen pairs' mask IoUs (seg.on)
  bool classic_ciou = false;  // CIoU of releases before 8.4.144 (geometry.h RuleSet)

  // Step 1: anchor a lies in the candidate region of `row` (and passes its level gate, for pose); candidate: and the
  // row is a real object. The walks of the row kernels test region and gate in registers (RegionOf, RowGate).
  __device__ float2 point(int64_t a) const { return __ldg(reinterpret_cast<const float2*>(this->anc) + a); }
  __device__ bool contains(int64_t row, int64_t a) const {
    const float2 p = point(a);
    return prep.regions.contains(row, D, p.x, p.y) && pose.gate(row).allows(a);
  }
  __device__ bool candidate(int64_t row, int64_t a) const { return this->valid[row] && contains(row, a); }

  // Step 2: the overlap of object `row` and prediction p = b*A + a (for pose, the OKS when the object has a visible
  // keypoint; for segmentation, the mean of the box overlap and the pair's mask IoU), and the metric of the pair
  // from it.
  __device__ T box_overlap(int64_t row, int64_t p) const {
    return pair_overlap(this->gt + row * D, prep.gvals + row * kBoxValues, this->pd + p * D,
                        prep.pvals + p * kBoxValues, D, classic_ciou);
  }
  __device__ T overlap(int64_t row, int64_t p) const {
    const bool keypoints = pose.on && pose.rows[row].n_visible > 0;
    if (keypoints && !pose.mean) return pose.oks(row, p);
    const T o = box_overlap(row, p);
    if (keypoints) return geom::mean2(o, static_cast<T>(pose.oks(row, p)));
    if (!seg.on) return o;
    const int64_t a = p - (row / this->M) * this->A;
    return geom::mean2(o, seg.mask_iou(row, a));
  }

  __device__ T align(int64_t row, int64_t p, T o) const {
    const int64_t label = this->labels[row];
    CUDA_KERNEL_ASSERT(label >= 0 && label < this->C &&
                       "gt_labels: a real object has a label outside [0, num_classes)");
    return rules::align_metric<S, T>(this->scores[p * this->C + label], o, this->alpha, this->beta, pow_wide);
  }

  __device__ KeyedEntry<T> entry(int64_t row, int64_t b, int64_t a) const {
    const T o = overlap(row, b * this->A + a);
    const T al = align(row, b * this->A + a, o);
    return {{al, o, static_cast<int32_t>(a)}, order_key(al)};
  }
  // Segmentation: the entry by which the pairs that get a mask IoU are chosen, the box metric plus eps.
  __device__ KeyedEntry<T> box_entry(int64_t row, int64_t b, int64_t a) const {
    const T o = box_overlap(row, b * this->A + a);
    const T m = rules::mask_choice_metric(align(row, b * this->A + a, o), this->eps);
    return {{m, o, static_cast<int32_t>(a)}, order_key(m)};
  }
};

// What the row kernels of candidate_topk.cuh do with a row's pairs: its entries (entry), what is recorded of each
// candidate pair (record) and what becomes of the k chosen (take).
// Step 3 proper: the pair's metric; every candidate pair goes to the PairLog and the chosen become claims.
template <typename S, typename T>
struct ClaimPass {
  PairLog log;
  Claims claims;
  int k;
  __device__ KeyedEntry<T> entry(const Problem<S, T>& P, int64_t row, int64_t b, int64_t a) const {
    return P.entry(row, b, a);
  }
  __device__ void record(int64_t row, const KeyedEntry<T>& e) const { log.record(row, e); }
  __device__ void take(int64_t row, int32_t a, uint32_t) const { claims.put(row, a); }
};

// Segmentation, step 2: the box metric plus eps; the min(3K, A) chosen get a mask IoU (SegChoices).
template <typename S, typename T>
struct MaskChoicePass {
  SegChoices choices;
  int k;
  __device__ KeyedEntry<T> entry(const Problem<S, T>& P, int64_t row, int64_t b, int64_t a) const {
    return P.box_entry(row, b, a);
  }
  __device__ void record(int64_t, const KeyedEntry<T>&) const {}
  __device__ void take(int64_t row, int32_t a, uint32_t) const { choices.put(row, a); }
};

// Segmentation, step 3 before the decode: the pairs not chosen for a mask IoU have mask IoU 0, so their entries are
// final before it. Each row ranks them among its anchors other than its chosen ones (the chosen get key 0, below
// every metric's key: order_key never gives 0), keeps those ranked within its first K (UnchosenTop) and sends them
// to the PairLog; seg_claims_kernel does the same for the chosen pairs after the decode and merges.
template <typename S, typename T>
struct UnchosenPass {
  PairLog log;
  UnchosenTop top;
  int k;
  __device__ KeyedEntry<T> entry(const Problem<S, T>& P, int64_t row, int64_t b, int64_t a) const {
    if (P.seg.slot_of(row, a) >= 0) return {{T(0), T(0), static_cast<int32_t>(a)}, 0u};
    return P.entry(row, b, a);
  }
  __device__ void record(int64_t row, const KeyedEntry<T>& e) const {
    if (e.key != 0u) log.record(row, e);
  }
  __device__ void take(int64_t row, int32_t a, uint32_t key) const {
    if (key != 0u) top.put(row, a, key);
  }
};

}  // namespace gpu
}  // namespace lucid
