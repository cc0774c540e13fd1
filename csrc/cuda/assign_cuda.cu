// torch.ops.lucid.assign on the GPU: SPEC.md steps 1-8, bit for bit as the reference on CUDA, without any
// (B, M, A) tensor and without host synchronisation (CUDA-graph capturable).
//
// Design note: the passes, what each reads and writes, and why memory stays bounded. Seven launches per call (nine
// with a second top-k), no memset: the host time of a call is mostly its launches.
//
//   prep_kernel              block 0: an index of the anchors by a 64 x 64 grid of cells over their bounding box
//                            (A ints). Other blocks: clear the workspace's counters, and per object and prediction
//                            (B*M + B*A threads) the candidate region of each object (side floor) and atan(w/h)
//                            (HBB) or the Gaussian (OBB) of every box. Writes B*M regions + (B*M + B*A) * 3 floats.
//   warp_rows_kernel         (one warp per object row) visits the anchors of the cells under the row's candidate
//                            region: containment, then metric and overlap of the inside ones. A row with at most
//                            kWarpCap candidates (most rows) ranks them among all A anchors by (metric desc,
//                            index asc), outside anchors having metric 0 (the zero fill of DESIGN.md trap 1), and
//                            claims its top K; a larger row goes to a list of medium rows.
//   candidates_topk_kernel   (blocks of 256 taking medium rows from a list) the same selection from a list of up to
//                            kListCap candidates in shared memory (put in anchor order by a bitmap of the anchors,
//                            or by a sort when A > kBitWords * 32), with a radix select on order-preserving 32-bit
//                            keys and a block scan for the ties. A row with more candidates goes to a list of big
//                            rows.
//   big_rows_kernel          (blocks of 512 taking big rows in turn) the same from a bitmap of the row's candidates
//                            and a list of (key, anchor) pairs in dynamic shared memory (A pairs when they fit).
//                            Every claim (B*M*K anchor, metric, overlap) also counts, per anchor, its claims
//                            (atomicAdd) and its largest claiming slot (atomicMax: the claimant when the count is 1).
//   resolve_claims_kernel    (one thread per anchor) count 0: background; count 1: the claimant; count > 1: appended
//                            to a list of conflicted anchors (B*A).
//   resolve_conflicts_kernel (one warp per conflicted anchor) the first row with the largest overlap over all M rows,
//                            recomputed (trap 2). With the previous kernel: owner, metric, overlap, B*A each, and per
//                            row the max metric / overlap / count of what it owns (integer atomicMax on
//                            order-preserving keys: order-independent), or with a second top-k a list of what it owns.
//   second_topk_warp_kernel, second_topk_rows_kernel  (K2 != K) the same selection over what each row owns (trap
//                            3): the list (B*M*32 ints) ranked by a warp per row; rows owning more than 32 anchors
//                            or with non-finite metrics scan all A anchors. The survivors make the row maxima.
//   outputs_kernel           (a block per 256 anchors) the targets and the scores; background anchors take row 0
//                            (trap 5), scores use trap 4.
//
// Every buffer is O(B*M*K + B*A + B*M); all come from the caching allocator on the current stream. Integer atomics
// only; results do not depend on the order of threads. Indices into (B, A, C) and (B, M, ...) arrays are 64-bit.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/macros/Macros.h>
#include <torch/library.h>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "amp.h"
#include "checks.h"
#include "geometry.h"

namespace lucid {
namespace {

constexpr int kThreads = 256;
constexpr int kListCap = 4096;  // candidates per row in candidates_topk_kernel's list; more: a big row
constexpr int kBitWords = 2048;  // its bitmap of a row's candidates covers up to 65,536 anchors
constexpr uint32_t kZeroKey = 0x80000000u;

// Order-preserving key of a metric: larger key = ranks first. NaN ranks above every number; -0 ties with +0.
__device__ __forceinline__ uint32_t order_key(float v) {
  if (v != v) return 0xFFFFFFFFu;
  if (v == 0.0f) return kZeroKey;
  const uint32_t bits = __float_as_uint(v);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}
__device__ __forceinline__ float key_to_float(uint32_t k) {
  if (k == 0xFFFFFFFFu) return __int_as_float(0x7fc00000);
  const uint32_t bits = (k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k;
  return __uint_as_float(bits);
}

template <typename T>
struct Entry {
  T align;
  T overlap;
  int32_t anchor;
  uint32_t key;
};

// Per row, what step 8 and the second top-k need to know about non-finite metrics (geometry.h, "step 8 with
// non-finite metrics"): whether a candidate pair has a NaN metric or overlap, and how many have an infinite metric.
// Each candidate pair is noted exactly once, by the pass-1 kernel that computes its entry for the list.
// An image none of whose rows is flagged cannot be poisoned (geometry.h): img_flag lets the output kernel skip the
// rows of such images.
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

// The claims of pass 1: row r's chosen anchors in slots r*K .. r*K+K-1 (as many as it chose), and per anchor of the
// image the number of claims (integer atomicAdd) and the largest claiming slot (atomicMax: the claimant when the
// count is 1).
template <typename T>
struct Claims {
  int32_t* anchor;  // (B*M*K)
  T* align;
  T* ov;
  int32_t* count;                // (B*A)
  unsigned long long* claimant;  // (B*A)
  int64_t A, M;
  int K;
  __device__ void put(int64_t row, int slot, const Entry<T>& e) const {
    const int64_t i = row * K + slot;
    anchor[i] = e.anchor;
    align[i] = e.align;
    ov[i] = e.overlap;
    const int64_t p = (row / M) * A + e.anchor;
    atomicAdd(&count[p], 1);
    atomicMax(&claimant[p], static_cast<unsigned long long>(i));
  }
};

// Per row, over the anchors it finally owns: the maxima of metric and overlap (integer atomicMax on order keys, so
// order-independent), how many it owns and how many of those have an infinite metric (step 8).
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

// What pass 3 records of each anchor's owner: its row statistics, or, when a second top-k follows (which decides
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

template <typename T>
struct Prep {
  // per object row: region + values of the overlap; per prediction: values of the overlap
  const geom::HbbRegion<T>* hbb;
  const geom::ObbRegion<T>* obb;
  const T* gprep;  // (B*M, W)
  const T* pprep;  // (B*A, W)
};

template <typename S, typename T>
struct Problem {
  const S* scores;  // (B, A, C) contiguous
  const T* pd;      // (B, A, D)
  const T* anc;     // (A, 2)
  const T* gt;      // (B, M, D)
  const int64_t* labels;  // (B, M)
  const bool* valid;      // (B, M)
  int64_t B, A, C, M;
  int D, K;  // K2 goes to the second top-k kernels as an argument
  double alpha, beta;
  T eps;
  Prep<T> prep;
  bool pow_wide;  // s^alpha as for scores widened to float32 (CUDA autocast, amp.h)

  __device__ bool contains(int64_t row, int64_t a) const {
    const T px = anc[2 * a], py = anc[2 * a + 1];
    return D == 4 ? geom::hbb_contains(prep.hbb[row], px, py) : geom::obb_contains(prep.obb[row], px, py);
  }
  __device__ bool candidate(int64_t row, int64_t a) const { return valid[row] && contains(row, a); }

  __device__ T overlap(int64_t row, int64_t p) const {  // p = b*A + a
    const T* g = gt + row * D;
    const T* q = pd + p * D;
    T o;
    if (D == 4) {
      o = geom::ciou<T>(g[0], g[1], g[2], g[3], q[0], q[1], q[2], q[3], prep.gprep[row * 3], prep.pprep[p * 3]);
    } else {
      const T* gg = prep.gprep + row * 3;
      const T* pg = prep.pprep + p * 3;
      o = geom::probiou<T>(g[0], g[1], {gg[0], gg[1], gg[2]}, q[0], q[1], {pg[0], pg[1], pg[2]});
    }
    return geom::clamp_min(o, T(0));
  }

  __device__ T align(int64_t row, int64_t p, T o) const {
    const int64_t label = labels[row];
    CUDA_KERNEL_ASSERT(label >= 0 && label < C && "gt_labels: a real object has a label outside [0, num_classes)");
    const S s = scores[p * C + label];
    if (pow_wide) {  // the float32 power of the widened score, with a float32 exponent
      const T sp = geom::pow_scalar(static_cast<T>(s), static_cast<double>(static_cast<float>(alpha)));
      return geom::mul(sp, geom::pow_scalar(o, beta));
    }
    // s.pow(alpha) in the score's dtype (the exponent rounded to S, computed in T, rounded to S), times o.pow(beta)
    const double e = static_cast<double>(static_cast<S>(alpha));
    const T sp = static_cast<T>(static_cast<S>(geom::pow_scalar(static_cast<T>(s), e)));
    return geom::mul(sp, geom::pow_scalar(o, beta));
  }

  __device__ Entry<T> entry(int64_t row, int64_t b, int64_t a) const {
    const T o = overlap(row, b * A + a);
    const T al = align(row, b * A + a, o);
    return {al, o, static_cast<int32_t>(a), order_key(al)};
  }
};

// ---- per-box preparation -----------------------------------------------------------------------------------------
// An input of one value (or D values) per object row, (B, M[, k]) with any strides, as the caller passed it: the
// peer trainer's gt_labels and gt_bboxes are slices of one targets tensor, so they are not contiguous.
template <typename T>
struct RowsIn {
  const T* p;
  int64_t M, s0, s1, s2;  // strides of the batch, row and last dimensions
  __device__ T at(int64_t row, int k = 0) const { return p[(row / M) * s0 + (row % M) * s1 + k * s2]; }
};

// The per-row inputs as the kernels read them: valid (mask_gt != 0) and the labels as int64. float32 mask_gt and
// gt_labels (what trainers pass), of any strides, are converted here, by prep_kernel, as ATen's ne(0) and to(int64)
// would; other dtypes are converted by ATen before the call (mask_f.p is then null).
struct RowInputs {
  RowsIn<float> mask_f;
  RowsIn<float> label_f;
  bool* valid;  // written here when mask_f.p is set, else already filled
  int64_t* labels;
  __device__ bool convert(int64_t row) const {
    if (mask_f.p == nullptr) return valid[row];
    const bool v = mask_f.at(row) != 0.0f;
    valid[row] = v;
    labels[row] = static_cast<int64_t>(label_f.at(row));
    return v;
  }
};

// Box j of the objects (is_gt) or of the predictions: the values its overlaps need (atan(w/h) for HBB, the
// Gaussian for OBB) and, for an object, its candidate region.
// An object's box is also copied, contiguous, to gt_copy, which every later pass reads.
template <typename T>
__device__ void prep_box(const RowsIn<T>& gt, T* __restrict__ gt_copy, const RowInputs& rows,
                         const T* __restrict__ pd, bool is_gt, int64_t j, int D, T stride_val,
                         geom::HbbRegion<T>* hbb, geom::ObbRegion<T>* obb, T* gprep, T* pprep) {
  bool real = false;
  T box[5] = {};  // in registers: every index below is known at compile time
  if (is_gt) real = rows.convert(j);
#pragma unroll
  for (int k = 0; k < 5; ++k) {
    if (k < D) {
      if (is_gt) {
        box[k] = gt_copy[j * D + k] = gt.at(j, k);
      } else {
        box[k] = pd[j * D + k];
      }
    }
  }
  T* out = (is_gt ? gprep : pprep) + j * 3;
  if (D == 4) {
    // atan(w / (h + eps)), as the reference's (w / h).atan() on the device
    const T w = geom::sub(box[2], box[0]);
    const T h = geom::add(geom::sub(box[3], box[1]), T(geom::kIouEps));
    out[0] = ::atan(geom::div(w, h));
    if (is_gt) hbb[j] = geom::hbb_candidate_region<T>(box[0], box[1], box[2], box[3], real, stride_val);
  } else {
    const T c = ::cos(box[4]), s = ::sin(box[4]);
    const auto g = geom::gaussian<T, /*kReciprocal=*/true>(box[2], box[3], c, s);
    out[0] = g.a;
    out[1] = g.b;
    out[2] = g.c;
    if (is_gt) obb[j] = geom::obb_candidate_region<T>(box[0], box[1], box[2], box[3], c, s, real, stride_val);
  }
}

// ---- top-k of one row over all A anchors -------------------------------------------------------------------------
// Entries (the explicit ones: candidates, or owned anchors) come from a Source in increasing anchor order; every
// other anchor of the row has metric 0 (key kZeroKey). Selects the k best of the A anchors by (key desc, index asc)
// and calls take(entry, slot) for each chosen explicit entry, slot in [0, k), in anchor order.
struct RadixState {
  int hist[256];
  uint32_t prefix;
  int k_rem;
  int n;
};

// A medium row in shared memory: its candidates' (key, anchor) pairs in anchor order (only the K chosen get their
// metric and overlap computed again), found through a bitmap over the A anchors when it fits (A <= kBitWords * 32),
// else in the order found and then sorted.
struct SharedRow : RadixState {
  uint32_t key[kListCap];
  int32_t anchor[kListCap];
  uint32_t bits[kBitWords];
};

template <int NT>
using BlockScanT = cub::BlockScan<int, NT>;
using BlockScan = BlockScanT<kThreads>;
using BlockReduce = cub::BlockReduce<int, kThreads>;

// hist[bin] += 1 for the lanes with `active`; called by all 32 lanes of a warp together. Lanes with the same bin
// add once, through their leader, so that the many keys of a row sharing a bin do not serialise on one address.
__device__ __forceinline__ void hist_add(int* hist, bool active, uint32_t bin) {
  const unsigned lanes = __ballot_sync(0xffffffffu, active);
  if (!active) return;
  const unsigned peers = __match_any_sync(lanes, bin);
  if ((threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&hist[bin], __popc(peers));
}

// Source over a compacted (key, anchor) list in anchor order; the entries it gives hold no metric or overlap.
template <typename T>
struct KeySource {
  const uint32_t* keys;
  const int32_t* anchors;
  int64_t n;
  __device__ int64_t size() const { return n; }
  __device__ bool get(int64_t i, Entry<T>& e) const {
    e.key = keys[i];
    e.anchor = anchors[i];
    return true;
  }
};

// Source that recomputes candidates of (row, b) over all A anchors.
template <typename S, typename T>
struct RecomputeSource {
  const Problem<S, T>* P;
  int64_t row, b;
  __device__ int64_t size() const { return P->A; }
  __device__ bool get(int64_t a, Entry<T>& e) const {
    if (!P->contains(row, a)) return false;
    e = P->entry(row, b, a);
    return true;
  }
};

// Source over the anchors a row owns (second top-k). With `P` (a row with non-finite metrics), the row's other candidates whose metric is not finite take part too, as
// NaN (align * 0 in the dense form): they take places in the selection without being kept.
template <typename S, typename T>
struct OwnedSource {
  const int64_t* owner;  // (A) of this image
  const T* own_align;
  const T* own_ov;
  int64_t m, A;
  const Problem<S, T>* P;  // null unless the row has non-finite metrics
  int64_t row, b;
  __device__ int64_t size() const { return A; }
  __device__ bool get(int64_t a, Entry<T>& e) const {
    if (owner[a] == m) {
      e = {own_align[a], own_ov[a], static_cast<int32_t>(a), order_key(own_align[a])};
      return true;
    }
    if (P == nullptr || !P->candidate(row, a)) return false;
    const Entry<T> full = P->entry(row, b, a);
    if (isfinite(full.align)) return false;
    const T nan = __int_as_float(0x7fc00000);
    e = {nan, full.overlap, static_cast<int32_t>(a), order_key(nan)};
    return true;
  }
};

// Radix select of the k-th largest key among the explicit entries plus `implicit` anchors of key kZeroKey.
// for_each_key(f) calls f(active, key) for this thread's share of the explicit entries, in any order, with all 32
// lanes of a warp calling together (active false on lanes without an entry). Leaves the k-th key in sh.prefix and,
// in sh.k_rem, how many anchors with exactly that key are taken (the first ones by index).
template <typename ForEachKey>
__device__ void radix_select(ForEachKey for_each_key, int64_t implicit, int k, RadixState& sh) {
  if (threadIdx.x == 0) {
    sh.prefix = 0;
    sh.k_rem = k;
  }
  __syncthreads();
  uint32_t mask = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) sh.hist[i] = 0;
    __syncthreads();
    const uint32_t prefix = sh.prefix;
    const int k_rem = sh.k_rem;  // read here, written only after the next barrier
    for_each_key([&](bool active, uint32_t key) {
      hist_add(sh.hist, active && (key & mask) == prefix, (key >> shift) & 255u);
    });
    if (threadIdx.x == 0 && (kZeroKey & mask) == prefix && implicit > 0) {
      // at most A, which fits an int (A < 2^30 is checked by the host)
      atomicAdd(&sh.hist[(kZeroKey >> shift) & 255u], static_cast<int>(implicit));
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      // warp 0 finds the bin holding the k_rem-th largest key: each lane sums 8 bins from the top, a warp scan
      // finds the lane where the running count reaches k_rem, and that lane walks its 8 bins
      const int lane = threadIdx.x;
      int cnt = 0;
      for (int j = 0; j < 8; ++j) cnt += sh.hist[255 - lane * 8 - j];
      int incl = cnt;
      for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
      }
      const int excl = incl - cnt;
      if (excl < k_rem && incl >= k_rem) {
        int cum = excl;
        for (int j = 0; j < 8; ++j) {
          const int bin = 255 - lane * 8 - j;
          if (cum + sh.hist[bin] >= k_rem) {
            sh.k_rem = k_rem - cum;
            sh.prefix = prefix | (static_cast<uint32_t>(bin) << shift);
            break;
          }
          cum += sh.hist[bin];
        }
      }
    }
    mask |= 0xFFu << shift;
    __syncthreads();
  }
}

// Given the k-th key and the number of ties to take, walks the explicit entries in anchor order and calls
// take(entry, slot) for the chosen ones, slot in [0, k). Ties at kth rank by anchor index among all anchors with
// that key; for the zero key that includes the implicit anchors.
template <int NT, typename T, typename Src, typename Take>
__device__ void take_in_order(const Src& src, uint32_t kth, int k_eq, typename BlockScanT<NT>::TempStorage& scan_tmp,
                              Take take) {
  static_assert(NT < (1 << 15), "the per-chunk counts are packed in 16 bits");
  int before_ne = 0, before_eq = 0, before_taken = 0;  // running totals over earlier chunks (same in all threads)
  const int64_t n = src.size();
  for (int64_t base = 0; base < n; base += blockDim.x) {
    const int64_t i = base + threadIdx.x;
    Entry<T> e;
    const bool has = i < n && src.get(i, e);
    const int is_eq = has && e.key == kth;
    const int is_ne_zero = has && e.key != kZeroKey;  // explicit entries that are not metric-0 anchors
    // both counts in one scan: at most NT per chunk, so each fits 16 bits
    int ex_both, sum_both;
    BlockScanT<NT>(scan_tmp).ExclusiveSum(is_eq | (is_ne_zero << 16), ex_both, sum_both);
    __syncthreads();
    const int ex_eq = ex_both & 0xFFFF, ex_ne = ex_both >> 16, sum_eq = sum_both & 0xFFFF, sum_ne = sum_both >> 16;
    bool chosen = false;
    if (has) {
      if (e.key > kth) {
        chosen = true;
      } else if (is_eq) {
        const int64_t rank = kth == kZeroKey ? static_cast<int64_t>(e.anchor) - (before_ne + ex_ne)
                                             : static_cast<int64_t>(before_eq + ex_eq);
        chosen = rank < k_eq;
      }
    }
    int ex_taken = 0, sum_taken = 0;
    if (__syncthreads_or(chosen)) {  // most chunks of a long row choose nothing: no scan for them
      BlockScanT<NT>(scan_tmp).ExclusiveSum(static_cast<int>(chosen), ex_taken, sum_taken);
      __syncthreads();
    }
    if (chosen) take(e, before_taken + ex_taken);
    before_eq += sum_eq;
    before_ne += sum_ne;
    before_taken += sum_taken;
  }
}

// Top-k of a row whose explicit entries come from src (in anchor order).
template <int NT, typename T, typename Src, typename Take>
__device__ void select_row(const Src& src, int64_t n_explicit, int64_t A, int k, RadixState& sh,
                           typename BlockScanT<NT>::TempStorage& scan_tmp, Take take) {
  radix_select(
      [&](auto f) {
        for (int64_t base = 0; base < src.size(); base += blockDim.x) {
          const int64_t i = base + threadIdx.x;
          Entry<T> e;
          const bool has = i < src.size() && src.get(i, e);
          f(has, has ? e.key : 0u);
        }
      },
      A - n_explicit, k, sh);
  take_in_order<NT, T>(src, sh.prefix, sh.k_rem, scan_tmp, take);
}

// ---- anchor cell index -----------------------------------------------------------------------------------------
// Anchors are bucketed into a kCells x kCells grid over their bounding box, so that a row visits only the anchors of
// the cells its candidate region's bounding box touches. The candidate set does not depend on the bucketing (the
// exact containment test decides; the box is widened by a margin), and the selection ranks candidates by anchor
// index wherever they tie, so the result is the same as a scan of all anchors in order.
constexpr int kCells = 64;
constexpr int kPrepThreads = 1024;

// One axis of the grid: cell = (v - lo) * scale, clamped to [0, kCells). Multiplying by a fixed positive scale is
// monotonic, as the containment region's bounding box needs (its cells hold every anchor between its corners).
struct Axis {
  float lo;
  float scale;  // NaN: the index cannot be used (an infinite or NaN span)
};

__device__ __forceinline__ Axis make_axis(float lo, float hi) {
  if (!(hi - lo < INFINITY)) return {lo, NAN};
  const float span = hi - lo;
  return {lo, span > 0.0f ? kCells / span : 0.0f};
}

// Cell of a point along one axis; -1 when the index cannot be used.
__device__ __forceinline__ int cell_of(float v, Axis ax) {
  if (ax.scale != ax.scale) return -1;
  const float f = (v - ax.lo) * ax.scale;
  if (!(f >= 0.0f)) return 0;  // also NaN
  return f >= kCells ? kCells - 1 : static_cast<int>(f);
}

struct CellIndex {
  const Axis* axes;        // x, y
  const int32_t* offsets;  // (kCells^2 + 1) start of each cell in `sorted`
  const int32_t* sorted;   // (A) anchors grouped by cell
};

// The anchors as given: float32, or float16/bfloat16 (the peer's, under autocast), which widen to float32 exactly.
struct AnchorsIn {
  const void* p;
  at::ScalarType type;
  __device__ float2 load(int32_t a) const {
    if (type == at::kHalf) {
      const auto* h = static_cast<const c10::Half*>(p);
      return make_float2(static_cast<float>(h[2 * a]), static_cast<float>(h[2 * a + 1]));
    }
    if (type == at::kBFloat16) {
      const auto* h = static_cast<const c10::BFloat16*>(p);
      return make_float2(static_cast<float>(h[2 * a]), static_cast<float>(h[2 * a + 1]));
    }
    const auto* f = static_cast<const float*>(p);
    return make_float2(f[2 * a], f[2 * a + 1]);
  }
};

__device__ __forceinline__ float warp_min_f(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fminf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_max_f(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The index, built by one block of kPrepThreads threads while the other blocks of prep_kernel prepare the boxes; it
// is on the critical path, so each anchor costs a few instructions per pass (measured on the H200 by Nsight Compute:
// a first version with order keys and 64-bit indices kept its SM busy 50,000 cycles while the others idled). Thread
// t takes anchors t, t + kPrepThreads, ... in every pass (it reads back only what it wrote itself):
//   1. the float32 copy of the anchors, and the bounds of the non-NaN ones (NaN anchors never lie inside a box and
//      are left out of the index; an infinite one makes the index unusable: every row then scans all anchors);
//   2. each anchor's cell (kept in `cell_of_anchor`, -1 when left out) and a count per cell in shared memory;
//   3. a block scan of the counts into offsets, and the anchors placed cell by cell (their order within a cell is
//      that of the shared-memory atomics; nothing depends on it).
__device__ void build_anchor_index(const AnchorsIn& in, int32_t A, float* __restrict__ anc,
                                   int32_t* __restrict__ cell_of_anchor, Axis* axes, int32_t* offsets,
                                   int32_t* __restrict__ sorted) {
  constexpr int kCellCount = kCells * kCells, per = kCellCount / kPrepThreads, kWarpsHere = kPrepThreads / 32;
  __shared__ float part[4][kWarpsHere];  // per warp: min x, min y, max x, max y
  __shared__ Axis ax[2];
  __shared__ int32_t cell[kCellCount];  // counts, then the cursor of each cell
  __shared__ typename BlockScanT<kPrepThreads>::TempStorage scan_tmp;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  for (int c = tid; c < kCellCount; c += kPrepThreads) cell[c] = 0;
  float lo_x = INFINITY, lo_y = INFINITY, hi_x = -INFINITY, hi_y = -INFINITY;
#pragma unroll 4
  for (int32_t a = tid; a < A; a += kPrepThreads) {
    const float2 p = in.load(a);
    anc[2 * a] = p.x;
    anc[2 * a + 1] = p.y;
    if (p.x == p.x && p.y == p.y) {
      lo_x = fminf(lo_x, p.x);
      lo_y = fminf(lo_y, p.y);
      hi_x = fmaxf(hi_x, p.x);
      hi_y = fmaxf(hi_y, p.y);
    }
  }
  lo_x = warp_min_f(lo_x), lo_y = warp_min_f(lo_y), hi_x = warp_max_f(hi_x), hi_y = warp_max_f(hi_y);
  if (lane == 0) {
    part[0][warp] = lo_x, part[1][warp] = lo_y, part[2][warp] = hi_x, part[3][warp] = hi_y;
  }
  __syncthreads();
  if (tid < 2) {
    float lo = INFINITY, hi = -INFINITY;
    for (int w = 0; w < kWarpsHere; ++w) lo = fminf(lo, part[tid][w]), hi = fmaxf(hi, part[tid + 2][w]);
    // no non-NaN anchor: lo > hi, every cell 0, and the index is empty
    ax[tid] = make_axis(lo, hi);
    axes[tid] = ax[tid];
  }
  __syncthreads();
  const Axis axx = ax[0], axy = ax[1];
#pragma unroll 4
  for (int32_t a = tid; a < A; a += kPrepThreads) {
    const float x = anc[2 * a], y = anc[2 * a + 1];
    const int cx = cell_of(x, axx), cy = cell_of(y, axy);
    const int c = x == x && y == y && cx >= 0 && cy >= 0 ? cy * kCells + cx : -1;
    cell_of_anchor[a] = c;
    if (c >= 0) atomicAdd(&cell[c], 1);
  }
  __syncthreads();
  int local[per];
  int sum = 0;
  for (int j = 0; j < per; ++j) {
    local[j] = cell[tid * per + j];
    sum += local[j];
  }
  int start, total;
  BlockScanT<kPrepThreads>(scan_tmp).ExclusiveSum(sum, start, total);
  for (int j = 0; j < per; ++j) {
    offsets[tid * per + j] = start;
    cell[tid * per + j] = start;
    start += local[j];
  }
  if (tid == kPrepThreads - 1) offsets[kCellCount] = total;
  __syncthreads();
#pragma unroll 4
  for (int32_t a = tid; a < A; a += kPrepThreads) {
    const int c = cell_of_anchor[a];
    if (c >= 0) sorted[atomicAdd(&cell[c], 1)] = a;
  }
}

template <typename T>
struct PrepArgs {
  RowsIn<T> gt;  // (B, M, D), any strides
  T* gt_copy;    // (B*M, D)
  RowInputs rows;
  const T* pd;  // (B*A, D)
  AnchorsIn anc_in;
  int64_t n_rows, n_pred, A;
  int D;
  T stride_val;
  geom::HbbRegion<T>* hbb;
  geom::ObbRegion<T>* obb;
  T* gprep;
  T* pprep;
  uint4* zero;  // the counters of the workspace, cleared here
  int64_t n_zero;
  float* anc;  // the anchors as float32, and their index
  int32_t* cell_of_anchor;
  Axis* axes;
  int32_t* offsets;
  int32_t* sorted;
};

// The first pass: block 0 builds the anchor index while the others clear the counters and prepare every object and
// prediction box (thread i: object row i for i < B*M, then prediction i - B*M).
template <typename T>
__global__ void __launch_bounds__(kPrepThreads) prep_kernel(const PrepArgs<T> p) {
  if (blockIdx.x == 0) {
    build_anchor_index(p.anc_in, static_cast<int32_t>(p.A), p.anc, p.cell_of_anchor, p.axes, p.offsets, p.sorted);
    return;
  }
  const int64_t i = static_cast<int64_t>(blockIdx.x - 1) * blockDim.x + threadIdx.x;
  const int64_t threads = static_cast<int64_t>(gridDim.x - 1) * blockDim.x;
  for (int64_t w = i; w < p.n_zero; w += threads) p.zero[w] = make_uint4(0u, 0u, 0u, 0u);
  if (i >= p.n_rows + p.n_pred) return;
  const bool is_gt = i < p.n_rows;
  prep_box(p.gt, p.gt_copy, p.rows, p.pd, is_gt, is_gt ? i : i - p.n_rows, p.D, p.stride_val, p.hbb, p.obb, p.gprep,
           p.pprep);
}

// Bounding box of a row's candidate region, widened so that rounding in the exact test cannot reach past it.
template <typename T>
__device__ bool region_bbox(const Prep<T>& prep, int64_t row, int D, T& x0, T& y0, T& x1, T& y1) {
  if (D == 4) {
    const auto& r = prep.hbb[row];
    x0 = r.x1, y0 = r.y1, x1 = r.x2, y1 = r.y2;
  } else {
    const auto& r = prep.obb[row];
    const T xs[4] = {r.ax, r.ax + r.abx, r.ax + r.adx, r.ax + r.abx + r.adx};
    const T ys[4] = {r.ay, r.ay + r.aby, r.ay + r.ady, r.ay + r.aby + r.ady};
    x0 = x1 = xs[0];
    y0 = y1 = ys[0];
    for (int j = 1; j < 4; ++j) {
      x0 = fminf(x0, xs[j]);
      x1 = fmaxf(x1, xs[j]);
      y0 = fminf(y0, ys[j]);
      y1 = fmaxf(y1, ys[j]);
    }
  }
  const T margin = T(1e-4) * (fabsf(x0) + fabsf(x1) + fabsf(y0) + fabsf(y1)) + T(1e-6);
  x0 -= margin, y0 -= margin, x1 += margin, y1 += margin;
  return isfinite(x0) && isfinite(x1) && isfinite(y0) && isfinite(y1);
}

// The set bits of bits[0, n_words) (a bitmap over anchors, in shared memory) in increasing order: out(i, anchor) for
// the i-th one. Each thread takes a run of consecutive words; one block scan of their popcounts gives its first i.
template <int NT, typename Out>
__device__ void compact_bits(const uint32_t* bits, int64_t n_words, typename BlockScanT<NT>::TempStorage& scan_tmp,
                             Out out) {
  const int64_t per = (n_words + NT - 1) / NT;
  const int64_t w0 = threadIdx.x * per, w1 = w0 + per < n_words ? w0 + per : n_words;
  int mine = 0;
  for (int64_t w = w0; w < w1; ++w) mine += __popc(bits[w]);
  int pos, total;
  BlockScanT<NT>(scan_tmp).ExclusiveSum(mine, pos, total);
  for (int64_t w = w0; w < w1; ++w) {
    uint32_t word = bits[w];
    while (word) {
      const int bit = __ffs(word) - 1;
      word &= word - 1;
      out(pos++, static_cast<int32_t>(w * 32 + bit));
    }
  }
}

// Sorts v[0, n) ascending (bitonic, padded to a power of two with INT_MAX; v holds kListCap values).
__device__ void sort_indices(int32_t* v, int n) {
  int size = 1;
  while (size < n) size <<= 1;
  for (int i = n + threadIdx.x; i < size; i += blockDim.x) v[i] = INT_MAX;
  __syncthreads();
  for (int k = 2; k <= size; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = threadIdx.x; i < size; i += blockDim.x) {
        const int l = i ^ j;
        if (l > i) {
          const bool up = (i & k) == 0;
          const int32_t a = v[i], b = v[l];
          if ((a > b) == up) {
            v[i] = b;
            v[l] = a;
          }
        }
      }
      __syncthreads();
    }
  }
}

// ---- pass 1 ----------------------------------------------------------------------------------------------------
// Three kernels by the size of the row. warp_rows_kernel gives every row a warp: padding rows and rows with at most
// kWarpCap candidates (most rows) are done there; the others go to a list of medium rows for
// candidates_topk_kernel (a block of kThreads per row, list of kListCap entries in shared memory), which passes rows
// with more than kListCap candidates on to big_rows_kernel. Each row's claims are made by exactly one of them.

// The cell range under a row's candidate region; false when it cannot be used (non-finite box or anchors).
template <typename S, typename T>
__device__ bool row_cells(const Problem<S, T>& P, const CellIndex& cells, int64_t row, int& cx0, int& cy0, int& cx1,
                          int& cy1) {
  T x0, y0, x1, y1;
  if (!region_bbox(P.prep, row, P.D, x0, y0, x1, y1)) return false;
  const Axis ax = cells.axes[0], ay = cells.axes[1];
  cx0 = cell_of(x0, ax), cx1 = cell_of(x1, ax);
  cy0 = cell_of(y0, ay), cy1 = cell_of(y1, ay);
  return cx0 >= 0 && cy0 >= 0 && cx1 >= 0 && cy1 >= 0;
}

constexpr int kWarps = kThreads / 32;
constexpr int kWarpCap = 64;  // candidates of a row ranked by one warp (its time grows as their square)
constexpr int kSlots = kWarpCap / 32;

// Ranks among all A anchors by (key desc, index asc) of a row's explicit entries, where the A - n anchors without an
// entry have the zero key. The n entries (n the same in all lanes) are keys[j], anchors[j] (shared memory); lane l
// holds entries l, l + 32, ... (kS of them at most) in key[s], anchor[s], and gets their ranks in rank[s] (slots
// past n are left alone). All 32 lanes call it. Each rank counts the entries ranked ahead among the n: O(n^2 / 32)
// steps a lane, one after another, which is why rows beyond kWarpCap go to a block (measured on the H200 with a cap
// of 256: ~110 us for a row of a few hundred candidates, against 10-15 us for 32).
template <int kS>
__device__ __forceinline__ void list_ranks(const uint32_t (&key)[kS], const int32_t (&anchor)[kS],
                                           const uint32_t* keys, const int32_t* anchors, int n, int64_t A,
                                           int64_t (&rank)[kS]) {
  const int lane = threadIdx.x % 32;
  int n_pos = 0, n_nonzero = 0, before[kS];
#pragma unroll
  for (int s = 0; s < kS; ++s) {
    const bool has = s * 32 + lane < n;
    n_pos += __popc(__ballot_sync(0xffffffffu, has && key[s] > kZeroKey));
    n_nonzero += __popc(__ballot_sync(0xffffffffu, has && key[s] != kZeroKey));
    before[s] = 0;  // explicit entries ranked ahead (positive / negative keys), or non-zero entries with a lower
                    // index (zero key)
  }
  for (int j = 0; j < n; ++j) {
    const uint32_t kj = keys[j];
    const int32_t aj = anchors[j];
#pragma unroll
    for (int s = 0; s < kS; ++s) {
      if (s * 32 >= n) break;  // the same in all lanes
      if (key[s] == kZeroKey) {
        before[s] += kj != kZeroKey && aj < anchor[s];
      } else if ((key[s] > kZeroKey) == (kj > kZeroKey) && kj != kZeroKey) {
        before[s] += kj > key[s] || (kj == key[s] && aj < anchor[s]);
      }
    }
  }
#pragma unroll
  for (int s = 0; s < kS; ++s) {
    if (key[s] > kZeroKey) rank[s] = before[s];
    else if (key[s] == kZeroKey) rank[s] = n_pos + static_cast<int64_t>(anchor[s]) - before[s];
    else rank[s] = n_pos + (A - n_nonzero) + before[s];
  }
}

template <typename S, typename T>
__global__ void __launch_bounds__(kThreads) warp_rows_kernel(Problem<S, T> P, CellIndex cells, RowNotes notes,
                                                               Claims<T> claims, int32_t* medium_rows,
                                                               int32_t* medium_n) {
  // each warp's row: its candidates' anchors (in the order found) and their metric keys, metrics and overlaps
  __shared__ int32_t s_anchor[kWarps][kWarpCap];
  __shared__ uint32_t s_key[kWarps][kWarpCap];
  __shared__ T s_align[kWarps][kWarpCap];
  __shared__ T s_ov[kWarps][kWarpCap];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (row >= P.B * P.M) return;  // whole warps
  if (!P.valid[row]) return;
  // every real row passes here: the device-side check of its label (no host synchronisation)
  CUDA_KERNEL_ASSERT(P.labels[row] >= 0 && P.labels[row] < P.C &&
                     "gt_labels: a real object (mask_gt != 0) has a label outside [0, num_classes)");
  const int64_t b = row / P.M;
  int cx0, cy0, cx1, cy1;
  int n = 0;  // candidates found (same in all lanes)
  bool fits = row_cells(P, cells, row, cx0, cy0, cx1, cy1);
  for (int cy = cy0; fits && cy <= cy1; ++cy) {
    const int begin = cells.offsets[cy * kCells + cx0], end = cells.offsets[cy * kCells + cx1 + 1];
    for (int j0 = begin; fits && j0 < end; j0 += 32) {
      const int j = j0 + lane;
      const int32_t a = j < end ? cells.sorted[j] : 0;
      const bool in = j < end && P.contains(row, a);
      const unsigned m = __ballot_sync(0xffffffffu, in);
      const int slot = n + __popc(m & ((1u << lane) - 1u));
      if (in && slot < kWarpCap) s_anchor[warp][slot] = a;
      n += __popc(m);
      fits = n <= kWarpCap;
    }
  }
  if (!fits) {
    if (lane == 0) medium_rows[atomicAdd(medium_n, 1)] = static_cast<int32_t>(row);
    return;
  }
  __syncwarp();
  uint32_t key[kSlots];
  int32_t anchor[kSlots];
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int i = s * 32 + lane;
    key[s] = 0u;
    anchor[s] = 0;
    if (i < n) {
      const Entry<T> e = P.entry(row, b, s_anchor[warp][i]);
      notes.note(row, e.align, e.overlap);
      key[s] = s_key[warp][i] = e.key;
      anchor[s] = e.anchor;
      s_align[warp][i] = e.align;
      s_ov[warp][i] = e.overlap;
    }
  }
  __syncwarp();
  // each candidate's rank among all A anchors decides whether it is among the K chosen
  int64_t rank[kSlots];
  list_ranks<kSlots>(key, anchor, s_key[warp], s_anchor[warp], n, P.A, rank);
  int taken = 0;
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int i = s * 32 + lane;
    const bool chosen = i < n && rank[s] < P.K;
    const unsigned chosen_lanes = __ballot_sync(0xffffffffu, chosen);
    if (chosen) {
      claims.put(row, taken + __popc(chosen_lanes & ((1u << lane) - 1u)),
                 Entry<T>{s_align[warp][i], s_ov[warp][i], anchor[s], key[s]});
    }
    taken += __popc(chosen_lanes);
  }
}

template <typename S, typename T>
__global__ void __launch_bounds__(kThreads, 4) candidates_topk_kernel(Problem<S, T> P, CellIndex cells, RowNotes notes,
                                                                     Claims<T> claims, const int32_t* medium_rows,
                                                                     const int32_t* medium_n, int32_t* medium_next,
                                                                     int32_t* big_rows, int32_t* big_n) {
  __shared__ SharedRow sh;
  __shared__ typename BlockScan::TempStorage scan_tmp;
  __shared__ int next;
  const int n_medium = *medium_n;
  // the candidates in anchor order: a bitmap compacted, or the anchors sorted
  const bool use_bits = P.A <= static_cast<int64_t>(kBitWords) * 32;
  const int n_words = use_bits ? static_cast<int>((P.A + 31) / 32) : 0;
  for (;;) {
    // the next row of the list: a block done with a small row takes another while others work on big ones
    for (int w = threadIdx.x; w < n_words; w += blockDim.x) sh.bits[w] = 0u;
    if (threadIdx.x == 0) {
      next = atomicAdd(medium_next, 1);
      sh.n = 0;
    }
    __syncthreads();
    if (next >= n_medium) break;
    const int64_t row = medium_rows[next];
    const int64_t b = row / P.M;
    int count = 0;  // candidates of the row (same in all threads)
    int cx0, cy0, cx1, cy1;
    if (row_cells(P, cells, row, cx0, cy0, cx1, cy1)) {
      // visit the anchors of the cells under the region's bounding box
      const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
      for (int cy = cy0 + warp; cy <= cy1; cy += warps) {
        const int begin = cells.offsets[cy * kCells + cx0], end = cells.offsets[cy * kCells + cx1 + 1];
        for (int j0 = begin; j0 < end; j0 += 32) {  // the warp's lanes together (warp-aggregated slots)
          const int j = j0 + lane;
          const int32_t a = j < end ? cells.sorted[j] : 0;
          const bool in = j < end && P.contains(row, a);
          const unsigned m = __ballot_sync(0xffffffffu, in);
          int base = 0;
          if (lane == 0 && m) base = atomicAdd(&sh.n, __popc(m));
          if (use_bits) {
            if (in) atomicOr(&sh.bits[a >> 5], 1u << (a & 31));
          } else {
            base = __shfl_sync(0xffffffffu, base, 0);
            const int slot = base + __popc(m & ((1u << lane) - 1u));
            if (in && slot < kListCap) sh.anchor[slot] = a;
          }
        }
      }
      __syncthreads();
      count = sh.n;
      if (count > kListCap) {  // a big row: left to big_rows_kernel, which writes its claims
        if (threadIdx.x == 0) big_rows[atomicAdd(big_n, 1)] = static_cast<int32_t>(row);
        __syncthreads();
        continue;
      }
      if (use_bits) {
        compact_bits<kThreads>(sh.bits, n_words, scan_tmp, [&](int i, int32_t a) { sh.anchor[i] = a; });
        __syncthreads();
      } else {
        sort_indices(sh.anchor, count);  // ends with a barrier
      }
      // the keys, a few per thread at once so that their loads overlap
      constexpr int kBatch = 2;
      for (int i0 = threadIdx.x; i0 < count; i0 += kBatch * kThreads) {
        Entry<T> e[kBatch];
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int i = i0 + u * kThreads;
          if (i < count) e[u] = P.entry(row, b, sh.anchor[i]);
        }
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int i = i0 + u * kThreads;
          if (i < count) {
            sh.key[i] = e[u].key;
            notes.note(row, e[u].align, e[u].overlap);
          }
        }
      }
      __syncthreads();
    } else {
      // no usable cell range (a non-finite box or anchors): scan every anchor in order, compacting into the list
      // while it has room
      for (int64_t base = 0; base < P.A; base += blockDim.x) {
        const int64_t a = base + threadIdx.x;
        const int inside = a < P.A && P.contains(row, a);
        int offset, total;
        BlockScan(scan_tmp).ExclusiveSum(inside, offset, total);
        __syncthreads();
        if (inside) {
          const Entry<T> e = P.entry(row, b, a);
          notes.note(row, e.align, e.overlap);
          if (count + offset < kListCap) {
            sh.key[count + offset] = e.key;
            sh.anchor[count + offset] = e.anchor;
          }
        }
        count += total;
      }
      __syncthreads();
    }
    if (count <= kListCap) {
      // the list holds keys only: the chosen entries are computed again (the same values)
      KeySource<T> src{sh.key, sh.anchor, count};
      select_row<kThreads, T>(src, count, P.A, P.K, sh, scan_tmp,
                              [&](const Entry<T>& e, int slot) { claims.put(row, slot, P.entry(row, b, e.anchor)); });
    } else {
      RecomputeSource<S, T> src{&P, row, b};
      select_row<kThreads, T>(src, count, P.A, P.K, sh, scan_tmp,
                              [&](const Entry<T>& e, int slot) { claims.put(row, slot, e); });
    }
    __syncthreads();  // shared memory is reused by the next row
  }
}

// The rows with more than kListCap candidates, kBigThreads threads per row, blocks taking rows from the list in
// turn. The candidates are marked in a bitmap over the image's anchors (dynamic shared memory, A bits), compacted
// in anchor order by a scan of the bitmap's popcounts, and each one's metric key is computed once into a list of
// `cap` (key, anchor) pairs, also in dynamic shared memory: cap = A whenever the device's shared memory allows
// (A <= ~27,000 anchors on an H100/H200), so the list cannot overflow there. A row with more candidates than cap
// takes the general in-order walk over all A anchors with the metrics recomputed (slow, and only possible with
// more anchors than that). Only the K chosen anchors get their full entry (metric and overlap) recomputed.
constexpr int kBigThreads = 512;

inline int64_t big_row_smem(int64_t A, int64_t cap) { return ((A + 31) / 32) * 4 + cap * 8; }

template <typename S, typename T>
__global__ void __launch_bounds__(kBigThreads, 1) big_rows_kernel(Problem<S, T> P, CellIndex cells, RowNotes notes,
                                                                    Claims<T> claims, const int32_t* big_rows,
                                                                    const int32_t* big_n, int64_t cap) {
  extern __shared__ __align__(16) unsigned char dyn[];
  const bool use_bits = cap >= 0;  // false: not even the bitmap fits in shared memory
  const int64_t n_words = use_bits ? (P.A + 31) / 32 : 0;
  uint32_t* bits = reinterpret_cast<uint32_t*>(dyn);
  uint32_t* keys = bits + n_words;
  int32_t* anchors = reinterpret_cast<int32_t*>(keys + (use_bits ? cap : 0));
  __shared__ RadixState sh;
  __shared__ typename BlockScanT<kBigThreads>::TempStorage scan_tmp;
  const int n_big = *big_n;
  for (int r = blockIdx.x; r < n_big; r += gridDim.x) {
    const int64_t row = big_rows[r];
    const int64_t b = row / P.M;
    for (int64_t w = threadIdx.x; w < n_words; w += blockDim.x) bits[w] = 0u;
    if (threadIdx.x == 0) sh.n = 0;
    __syncthreads();
    // the candidates, through the cells (candidates_topk_kernel found the cell range usable)
    int cx0, cy0, cx1, cy1;
    row_cells(P, cells, row, cx0, cy0, cx1, cy1);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    for (int cy = cy0 + warp; cy <= cy1; cy += warps) {
      const int begin = cells.offsets[cy * kCells + cx0], end = cells.offsets[cy * kCells + cx1 + 1];
      for (int j0 = begin; j0 < end; j0 += 32) {
        const int j = j0 + lane;
        const int32_t a = j < end ? cells.sorted[j] : 0;
        const bool in = j < end && P.contains(row, a);
        if (in && use_bits) atomicOr(&bits[a >> 5], 1u << (a & 31));
        const unsigned m = __ballot_sync(0xffffffffu, in);
        if (lane == 0 && m) atomicAdd(&sh.n, __popc(m));
      }
    }
    __syncthreads();
    const int64_t count = sh.n;
    const int k = P.K;
    // the list holds keys only: the chosen entries are recomputed
    auto take = [&](const Entry<T>& e, int slot) { claims.put(row, slot, P.entry(row, b, e.anchor)); };
    if (use_bits && count <= cap) {
      compact_bits<kBigThreads>(bits, n_words, scan_tmp, [&](int i, int32_t a) { anchors[i] = a; });
      __syncthreads();
      for (int64_t i = threadIdx.x; i < count; i += blockDim.x) {
        const Entry<T> e = P.entry(row, b, anchors[i]);
        notes.note(row, e.align, e.overlap);
        keys[i] = e.key;
      }
      __syncthreads();
      radix_select(
          [&](auto f) {
            for (int64_t base = 0; base < count; base += blockDim.x) {
              const int64_t i = base + threadIdx.x;
              f(i < count, i < count ? keys[i] : 0u);
            }
          },
          P.A - count, k, sh);
      KeySource<T> src{keys, anchors, count};
      take_in_order<kBigThreads, T>(src, sh.prefix, sh.k_rem, scan_tmp, take);
    } else {
      // note every candidate once (a walk over the cells), then the in-order walk over all anchors
      for (int cy = cy0 + warp; cy <= cy1; cy += warps) {
        const int begin = cells.offsets[cy * kCells + cx0], end = cells.offsets[cy * kCells + cx1 + 1];
        for (int j = begin + lane; j < end; j += 32) {
          const int32_t a = cells.sorted[j];
          if (P.contains(row, a)) {
            const Entry<T> e = P.entry(row, b, a);
            notes.note(row, e.align, e.overlap);
          }
        }
      }
      RecomputeSource<S, T> src{&P, row, b};
      select_row<kBigThreads, T>(src, count, P.A, k, sh, scan_tmp,
                                 [&](const Entry<T>& e, int slot) { claims.put(row, slot, e); });
    }
    __syncthreads();  // shared memory is reused by the next row
  }
}

// ---- passes 2-3 ------------------------------------------------------------------------------------------------
// (The claims were counted per anchor as pass 1 made them.) One thread per anchor: an anchor claimed once takes its
// claimant; an anchor claimed several times is appended to `conflicts` for resolve_conflicts_kernel.
template <typename T>
__global__ void resolve_claims_kernel(int64_t n, int64_t A, int64_t M, int k, const int32_t* count,
                                      const unsigned long long* claimant, const T* claim_align, const T* claim_ov,
                                      OwnerSink sink, int64_t* owner, T* own_align, T* own_ov, int64_t* conflicts,
                                      unsigned long long* n_conf) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int c = count[i];
  if (c == 0) {
    owner[i] = -1;
    own_align[i] = T(0);
    own_ov[i] = T(0);
  } else if (c == 1) {
    const int64_t slot = static_cast<int64_t>(claimant[i]);
    const int64_t row = slot / k;
    owner[i] = row - (i / A) * M;
    own_align[i] = claim_align[slot];
    own_ov[i] = claim_ov[slot];
    sink.add(row, i % A, own_align[i], own_ov[i]);
  } else {
    conflicts[atomicAdd(n_conf, 1ull)] = i;
  }
}

// One warp per conflicted anchor (warps take anchors from the list in turn): the M rows are shared by the lanes,
// and the first maximum of the overlap over all M rows (NaN counts as the maximum, as in torch.argmax; rows where
// the anchor is not a candidate count 0) is found by a warp reduction. Each anchor's result is written by its own
// warp, so the order of the list does not matter.
template <typename S, typename T>
__global__ void resolve_conflicts_kernel(Problem<S, T> P, const int64_t* conflicts, const int64_t* n_conf,
                                         OwnerSink sink, int64_t* owner, T* own_align, T* own_ov) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  const int64_t n = *n_conf;
  for (int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; w < n; w += warps) {
    const int64_t i = conflicts[w];
    const int64_t b = i / P.A, a = i % P.A;
    // each lane: first maximum over its rows m = lane, lane + 32, ...
    int64_t best = -1;
    T best_v = T(0);
    for (int64_t m = lane; m < P.M; m += 32) {
      const int64_t row = b * P.M + m;
      const T v = P.candidate(row, a) ? P.overlap(row, i) : T(0);
      if (best < 0 || (!geom::isnan_(best_v) && (geom::isnan_(v) || v > best_v))) {
        best = m;
        best_v = v;
      }
    }
    // combine lanes: better value wins (NaN above all), ties to the lower row
    for (int o = 16; o > 0; o >>= 1) {
      const int64_t ob = __shfl_down_sync(0xffffffffu, best, o);
      const T ov = __shfl_down_sync(0xffffffffu, best_v, o);
      if (ob >= 0) {
        const bool nan_me = geom::isnan_(best_v), nan_o = geom::isnan_(ov);
        bool take;
        if (best < 0) take = true;
        else if (nan_me || nan_o) take = nan_o && (!nan_me || ob < best);
        else take = ov > best_v || (ov == best_v && ob < best);
        if (take) {
          best = ob;
          best_v = ov;
        }
      }
    }
    if (lane == 0) {
      const int64_t row = b * P.M + best;
      owner[i] = best;
      own_ov[i] = best_v;
      own_align[i] = P.candidate(row, a) ? P.align(row, i, best_v) : T(0);
      sink.add(row, a, own_align[i], best_v);
    }
  }
}

// ---- pass 4 ----------------------------------------------------------------------------------------------------
// The second top-k (K2 != K) ranks, per row, what the row owns after the conflicts (trap 3), from the lists of owned
// anchors pass 3 made: second_topk_warp_kernel ranks the lists of rows that own at most kOwnCap anchors and have only
// finite metrics, a warp each, and passes the other rows to second_topk_rows_kernel, which scans all A anchors per
// row. The survivors are marked in `keep` and go into the row statistics; the owner array is left as it is (the
// output kernel reads `keep`), so no row's scan sees another row's result.
template <typename S, typename T>
__global__ void __launch_bounds__(kThreads) second_topk_warp_kernel(Problem<S, T> P, RowNotes notes,
                                                                      const int32_t* own_n, const int32_t* own_list,
                                                                      const T* own_align, const T* own_ov, int k2,
                                                                      int32_t* keep, RowStats stats,
                                                                      int32_t* slow_rows, int32_t* slow_n) {
  __shared__ uint32_t s_key[kWarps][kOwnCap];
  __shared__ int32_t s_anchor[kWarps][kOwnCap];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (row >= P.B * P.M) return;  // whole warps
  const int n = own_n[row];
  if (n == 0) return;
  if (n > kOwnCap || notes.flagged(row)) {
    if (lane == 0) slow_rows[atomicAdd(slow_n, 1)] = static_cast<int32_t>(row);
    return;
  }
  const int64_t b = row / P.M;
  const bool has = lane < n;
  int32_t anchor[1] = {has ? own_list[row * kOwnCap + lane] : 0};
  const int64_t p = b * P.A + anchor[0];
  uint32_t key[1] = {has ? order_key(own_align[p]) : 0u};
  s_key[warp][lane] = key[0];
  s_anchor[warp][lane] = anchor[0];
  __syncwarp();
  int64_t rank[1];
  list_ranks<1>(key, anchor, s_key[warp], s_anchor[warp], n, P.A, rank);
  if (has && rank[0] < k2) {
    keep[p] = 1;
    stats.add(row, own_align[p], own_ov[p]);
  }
}

template <typename S, typename T>
__global__ void __launch_bounds__(kThreads) second_topk_rows_kernel(Problem<S, T> P, RowNotes notes,
                                                                      const int64_t* owner, const T* own_align,
                                                                      const T* own_ov, int k2, int32_t* keep,
                                                                      RowStats stats, const int32_t* rows,
                                                                      const int32_t* n_rows) {
  const int64_t M = P.M, A = P.A;
  __shared__ RadixState sh;
  __shared__ typename BlockScan::TempStorage scan_tmp;
  __shared__ typename BlockReduce::TempStorage reduce_tmp;
  __shared__ int n_explicit;
  const int n_list = *n_rows;
  for (int i = blockIdx.x; i < n_list; i += gridDim.x) {
    const int64_t row = rows[i];
    const int64_t b = row / M, m = row % M;
    const int64_t* own = owner + b * A;
    const bool flagged = notes.flagged(row);
    OwnedSource<S, T> src{own, own_align + b * A, own_ov + b * A, m, A, flagged ? &P : nullptr, row, b};
    // the explicit entries: the owned anchors, and for a flagged row its candidates with non-finite metrics
    int mine = 0;
    for (int64_t a = threadIdx.x; a < A; a += blockDim.x) {
      Entry<T> e;
      mine += src.get(a, e);
    }
    const int all = BlockReduce(reduce_tmp).Sum(mine);
    if (threadIdx.x == 0) n_explicit = all;
    __syncthreads();
    // survivors: only anchors the row owns (the others take places without being kept)
    select_row<kThreads, T>(src, n_explicit, A, k2, sh, scan_tmp, [&](const Entry<T>& e, int) {
      if (own[e.anchor] == m) {
        keep[b * A + e.anchor] = 1;
        stats.add(row, e.align, e.overlap);
      }
    });
    __syncthreads();  // shared memory is reused by the next row
  }
}

// ---- pass 5 ----------------------------------------------------------------------------------------------------
// The outputs, a block per kThreads consecutive anchors of the (B, A) grid: first whether each image the block
// touches is poisoned (geometry.h; only images with a flagged row need their rows read), then per anchor its target
// label, box, index and normalised metric (background anchors take row 0: trap 5), then the block's stretch of the
// scores, written in order: one-hot * norm (trap 4).
template <typename T>
struct OutputArgs {
  const int64_t* owner;
  const int32_t* keep;  // the second top-k's survivors, or null
  const T* own_align;
  RowStats stats;
  RowNotes notes;
  const int64_t* labels;
  const T* gt;
  int64_t B, M, A, C;
  int D;
  T eps;
  int64_t* out_labels;
  T* out_boxes;
  T* out_scores;
  bool* out_fg;
  int64_t* out_idx;
};

template <typename T, typename I>
__global__ void __launch_bounds__(kThreads) outputs_kernel(const OutputArgs<T> o) {
  __shared__ int s_poisoned[kThreads];  // per image the block touches, from the first
  __shared__ int64_t s_label[kThreads];
  __shared__ T s_norm[kThreads];
  __shared__ bool s_fg[kThreads];
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * kThreads;
  const int64_t left = o.B * o.A - i0;
  const int n_here = left < kThreads ? static_cast<int>(left) : kThreads;
  const int64_t b0 = i0 / o.A, b1 = (i0 + n_here - 1) / o.A;  // at most kThreads images
  for (int64_t b = b0; b <= b1; ++b) {
    int poisoned = 0;
    if (o.notes.img_flag[b]) {  // the same in all threads
      int mine = 0;
      for (int64_t row = b * o.M + threadIdx.x; row < (b + 1) * o.M; row += kThreads) {
        mine |= geom::row_poisoned(o.notes.nan_seen[row] != 0, o.notes.inf_cand[row], o.stats.inf_owned[row]);
      }
      poisoned = __syncthreads_or(mine);
    }
    if (threadIdx.x == 0) s_poisoned[b - b0] = poisoned;
  }
  __syncthreads();
  if (threadIdx.x < n_here) {
    const int64_t i = i0 + threadIdx.x;
    const int64_t b = i / o.A;
    int64_t m = o.owner[i];
    if (m >= 0 && o.keep != nullptr && !o.keep[i]) m = -1;
    const bool fg = m >= 0;
    const int64_t idx = fg ? m : 0;
    const int64_t row = b * o.M + idx;
    o.out_fg[i] = fg;
    o.out_idx[i] = idx;
    const int64_t label = o.labels[row] < 0 ? 0 : o.labels[row];
    o.out_labels[i] = label;
    for (int d = 0; d < o.D; ++d) o.out_boxes[i * o.D + d] = o.gt[row * o.D + d];
    T norm = T(0);
    if (s_poisoned[b - b0]) {
      norm = __int_as_float(0x7fc00000);
    } else if (fg) {
      // maxima over the row: the owned anchors, and 0 from the others when the row does not own all A
      const bool has_zero = o.stats.owned[row] < o.A;
      T pa = static_cast<T>(key_to_float(o.stats.best_align[row]));
      T po = static_cast<T>(key_to_float(o.stats.best_ov[row]));
      if (has_zero) {
        pa = geom::max_(pa, T(0));
        po = geom::max_(po, T(0));
      }
      norm = geom::div(geom::mul(o.own_align[i], po), geom::add(pa, o.eps));
      if (o.M > 1) norm = geom::max_(norm, T(0));  // every other row contributes 0 to the maximum over rows
    }
    s_label[threadIdx.x] = label;
    s_norm[threadIdx.x] = norm;
    s_fg[threadIdx.x] = fg;
  }
  __syncthreads();
  // I: the index type within the block's stretch of n_here * C scores
  const I C = static_cast<I>(o.C), total = static_cast<I>(n_here) * C;
  T* scores = o.out_scores + i0 * o.C;
  for (I j = threadIdx.x; j < total; j += kThreads) {
    const I li = j / C, c = j % C;
    // one-hot * norm: off the label 0 * norm, which is NaN when norm is not finite
    scores[j] = (s_fg[li] && s_label[li] == c) ? s_norm[li] : geom::mul(T(0), s_norm[li]);
  }
}

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

// The working buffers of one call: O(B*M*K + B*A + B*M) in all.
template <typename T>
struct Workspace {
  // start at zero (cleared by prep_kernel: the first zero_words 16-byte words)
  int32_t* medium_n;
  int32_t* medium_next;
  int32_t* big_n;
  int32_t* slow_n;
  unsigned long long* n_conf;
  int32_t* count;                // claims per anchor (B*A)
  unsigned long long* claimant;  // (B*A)
  int32_t* keep;                 // second top-k survivors (B*A), when topk2 != topk
  int32_t* own_n;                // owned anchors per row (B*M), when topk2 != topk
  RowStats stats;                // (B*M) each
  int32_t* nan_seen;             // (B*M) RowNotes
  int32_t* inf_cand;
  int32_t* img_flag;             // (B)
  int64_t zero_words;
  // written before being read
  uint8_t* regions;
  T* gt;                // (B*M, D) the objects' boxes, contiguous
  T* gprep;
  T* pprep;
  float* anc;           // (A, 2) the anchors as float32
  int32_t* cell_of_anchor;  // (A)
  Axis* axes;
  int32_t* cell_offsets;
  int32_t* cell_sorted;
  int32_t* medium_rows;
  int32_t* big_rows;
  bool* valid;          // (B*M) mask_gt != 0, when converted by prep_kernel
  int64_t* labels;      // (B*M) likewise
  int32_t* own_list;   // (B*M*kOwnCap), when topk2 != topk
  int32_t* slow_rows;  // (B*M), when topk2 != topk
  int32_t* claim_anchor;
  T* claim_align;
  T* claim_ov;
  int64_t* conflicts;
  int64_t* owner;
  T* own_align;
  T* own_ov;

  void carve(Layout& L, int64_t B, int64_t A, int64_t M, int64_t K, bool second, int64_t D) {
    medium_n = L.take<int32_t>(1);
    medium_next = L.take<int32_t>(1);
    big_n = L.take<int32_t>(1);
    slow_n = L.take<int32_t>(1);
    n_conf = L.take<unsigned long long>(1);
    count = L.take<int32_t>(B * A);
    claimant = L.take<unsigned long long>(B * A);
    keep = L.take<int32_t>(second ? B * A : 0);
    own_n = L.take<int32_t>(second ? B * M : 0);
    stats.best_align = L.take<uint32_t>(B * M);
    stats.best_ov = L.take<uint32_t>(B * M);
    stats.owned = L.take<int32_t>(B * M);
    stats.inf_owned = L.take<int32_t>(B * M);
    nan_seen = L.take<int32_t>(B * M);
    inf_cand = L.take<int32_t>(B * M);
    img_flag = L.take<int32_t>(B);
    zero_words = (L.size() + 15) / 16;  // the next buffer starts past them (take aligns to 16)
    regions = L.take<uint8_t>(B * M * static_cast<int64_t>(D == 4 ? sizeof(geom::HbbRegion<T>)
                                                                 : sizeof(geom::ObbRegion<T>)));
    gt = L.take<T>(B * M * D);
    gprep = L.take<T>(B * M * 3);
    pprep = L.take<T>(B * A * 3);
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
    claim_anchor = L.take<int32_t>(B * M * K);
    claim_align = L.take<T>(B * M * K);
    claim_ov = L.take<T>(B * M * K);
    conflicts = L.take<int64_t>(B * A);
    owner = L.take<int64_t>(B * A);
    own_align = L.take<T>(B * A);
    own_ov = L.take<T>(B * A);
  }
};

// Launch facts of a kernel on the current device, asked of the driver once and then remembered (they cost more
// host time than a launch): its static shared memory, and how many blocks of a given size fit on one
// multiprocessor (at least 1). raise_smem_limit lets the kernel take `smem` bytes of dynamic shared memory.
struct KernelFacts {
  std::mutex mu;
  std::map<std::tuple<const void*, int, int, int64_t>, int64_t> values;  // (kernel, device, what/threads, smem)

  template <typename Kernel>
  int64_t get(Kernel kernel, int what, int64_t smem, const std::function<int64_t()>& ask) {
    int device = 0;
    C10_CUDA_CHECK(cudaGetDevice(&device));
    const auto key = std::make_tuple(reinterpret_cast<const void*>(kernel), device, what, smem);
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = values.find(key);
      if (it != values.end()) return it->second;
    }
    const int64_t v = ask();
    std::lock_guard<std::mutex> lock(mu);
    values[key] = v;
    return v;
  }
};
KernelFacts& kernel_facts() {
  static KernelFacts facts;
  return facts;
}

template <typename Kernel>
int64_t static_smem(Kernel kernel) {
  return kernel_facts().get(kernel, -1, 0, [&] {
    cudaFuncAttributes attr;
    C10_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
    return static_cast<int64_t>(attr.sharedSizeBytes);
  });
}

template <typename Kernel>
void raise_smem_limit(Kernel kernel, int64_t smem) {
  // the limit only ever goes up: a call with less dynamic shared memory must not lower it under a later call
  auto& facts = kernel_facts();
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  const auto key = std::make_tuple(reinterpret_cast<const void*>(kernel), device, -2, int64_t{0});
  std::lock_guard<std::mutex> lock(facts.mu);
  auto it = facts.values.find(key);
  if (it != facts.values.end() && it->second >= smem) return;
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  facts.values[key] = smem;
}

template <typename Kernel>
int64_t occupancy(Kernel kernel, int threads, int64_t smem) {
  return kernel_facts().get(kernel, threads, smem, [&] {
    int per_sm = 0;
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, static_cast<size_t>(smem)));
    return static_cast<int64_t>(std::max(per_sm, 1));
  });
}

inline unsigned blocks_for(int64_t n, int threads = kThreads) {
  const int64_t b = (n + threads - 1) / threads;
  TORCH_CHECK(b <= std::numeric_limits<int32_t>::max(), "lucid.assign: problem too large for one launch (", n,
              " threads)");
  return static_cast<unsigned>(b < 1 ? 1 : b);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> assign_cuda(
    const at::Tensor& pd_scores, const at::Tensor& pd_bboxes, const at::Tensor& anc_points, const at::Tensor& gt_labels,
    const at::Tensor& gt_bboxes, const at::Tensor& mask_gt, int64_t topk, int64_t topk2, int64_t num_classes,
    double alpha, double beta, double eps, double stride_val) {
  const int64_t D = check_assign_args(pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt, topk, topk2,
                                      num_classes, stride_val);
  const c10::cuda::CUDAGuard guard(pd_scores.device());
  const int64_t B = pd_scores.size(0), A = pd_scores.size(1), C = pd_scores.size(2), M = gt_bboxes.size(1);
  TORCH_CHECK(A < std::numeric_limits<int32_t>::max() / 2, "lucid.assign: too many anchors (", A, ")");
  TORCH_CHECK(topk < std::numeric_limits<int32_t>::max() && topk2 < std::numeric_limits<int32_t>::max(),
              "topk and topk2 must fit in 32 bits");
  const auto box_t = gt_bboxes.scalar_type();
  auto opts = pd_scores.options();
  auto target_labels = at::empty({B, A}, opts.dtype(at::kLong));
  auto target_bboxes = at::empty({B, A, D}, opts.dtype(box_t));
  auto target_scores = at::empty({B, A, C}, opts.dtype(box_t));
  auto fg_mask = at::empty({B, A}, opts.dtype(at::kBool));
  auto target_gt_idx = at::empty({B, A}, opts.dtype(at::kLong));
  if (M == 0) {
    target_labels.fill_(num_classes);
    target_bboxes.zero_();
    target_scores.zero_();
    fg_mask.zero_();
    target_gt_idx.zero_();
    return {target_labels, target_bboxes, target_scores, fg_mask, target_gt_idx};
  }
  if (B * A == 0) return {target_labels, target_bboxes, target_scores, fg_mask, target_gt_idx};
  const auto stream = at::cuda::getCurrentCUDAStream();
  const bool pow_wide = scores_pow_in_float32();  // set by the autocast kernel for float16/bfloat16 scores
  // float32 mask and labels (any strides) are converted by prep_kernel; others by ATen here
  const bool rows_in_kernel = mask_gt.scalar_type() == at::kFloat && gt_labels.scalar_type() == at::kFloat;
  at::Tensor valid_t, labels_t;
  if (!rows_in_kernel) {
    valid_t = mask_gt.reshape({B, M}).ne(0).contiguous();
    labels_t = gt_labels.reshape({B, M}).to(at::kLong).contiguous();
  }
  const auto scores = pd_scores.contiguous();
  // the anchors (float32, or float16/bfloat16 widened by prep_kernel) are read once, into the workspace
  // gt_bboxes is read as given (any strides) by prep_kernel, which copies it to the workspace
  const auto pd = pd_bboxes.contiguous(), anc = anc_points.contiguous();
  TORCH_CHECK(box_t == at::kFloat, "lucid.assign on CUDA takes float32 boxes and anchors, got ", box_t,
              " (the Python API falls back to the reference for other dtypes)");
  {
    using T = float;
    // every working buffer is carved from one allocation; the counters, which must start at zero, come first and
    // are cleared by prep_kernel
    const bool second = topk2 != topk;
    Workspace<T> w;
    Layout probe;
    w.carve(probe, B, A, M, topk, second, D);
    auto workspace = at::empty({probe.size()}, opts.dtype(at::kByte));
    Layout real{workspace.data_ptr<uint8_t>()};
    w.carve(real, B, A, M, topk, second, D);
    auto* hbb = reinterpret_cast<geom::HbbRegion<T>*>(w.regions);
    auto* obb = reinterpret_cast<geom::ObbRegion<T>*>(w.regions);
    // (B, M, k) or (B, M) inputs by their batch, row and last strides (the last is 0 for a 2-d one: k is 0 there)
    auto rows_in = [M](const auto* p, const at::Tensor& t) {
      return RowsIn<std::remove_cv_t<std::remove_pointer_t<decltype(p)>>>{p, M, t.stride(0), t.stride(1),
                                                                          t.dim() == 3 ? t.stride(2) : 0};
    };
    const RowInputs rows =
        rows_in_kernel
            ? RowInputs{rows_in(mask_gt.const_data_ptr<float>(), mask_gt),
                        rows_in(gt_labels.const_data_ptr<float>(), gt_labels), w.valid, w.labels}
            : RowInputs{{}, {}, valid_t.data_ptr<bool>(), labels_t.data_ptr<int64_t>()};
    // the counters, the anchor index (block 0) and the per-box values
    const PrepArgs<T> prep{rows_in(gt_bboxes.const_data_ptr<T>(), gt_bboxes), w.gt, rows, pd.data_ptr<T>(),
                           AnchorsIn{anc.const_data_ptr(), anc.scalar_type()},
                           B * M, B * A, A, static_cast<int>(D), static_cast<T>(stride_val), hbb, obb, w.gprep,
                           w.pprep, reinterpret_cast<uint4*>(workspace.data_ptr()), w.zero_words, w.anc,
                           w.cell_of_anchor, w.axes, w.cell_offsets, w.cell_sorted};
    prep_kernel<T><<<1 + blocks_for(B * M + B * A, kPrepThreads), kPrepThreads, 0, stream>>>(prep);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    const CellIndex cells{w.axes, w.cell_offsets, w.cell_sorted};
    const RowNotes notes{w.nan_seen, w.inf_cand, w.img_flag, M};
    const Claims<T> claims{w.claim_anchor, w.claim_align, w.claim_ov, w.count, w.claimant, A, M,
                           static_cast<int>(topk)};
    const OwnerSink sink{w.stats, second ? w.own_n : nullptr, w.own_list};

    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, scores.scalar_type(), "assign_cuda", [&] {
      using S = scalar_t;
      Problem<S, T> P{scores.data_ptr<S>(), pd.data_ptr<T>(), w.anc, w.gt,
                      rows.labels, rows.valid, B, A, C, M, static_cast<int>(D),
                      static_cast<int>(topk), alpha, beta, static_cast<T>(eps),
                      Prep<T>{hbb, obb, w.gprep, w.pprep}, pow_wide};
      TORCH_CHECK(B * M <= std::numeric_limits<int32_t>::max(), "lucid.assign: too many rows");
      const auto* props = at::cuda::getCurrentDeviceProperties();
      // pass 1: the claims, and the per-anchor claim counts
      warp_rows_kernel<S, T><<<blocks_for(B * M, kWarps), kThreads, 0, stream>>>(P, cells, notes, claims,
                                                                                 w.medium_rows, w.medium_n);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      {
        // the medium rows: as many blocks as fit on the device at once, each taking rows from the list in turn
        auto kernel = candidates_topk_kernel<S, T>;
        const int64_t grid = std::min<int64_t>(B * M, props->multiProcessorCount * occupancy(kernel, kThreads, 0));
        kernel<<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(P, cells, notes, claims, w.medium_rows,
                                                                      w.medium_n, w.medium_next, w.big_rows, w.big_n);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      }
      {
        // the big rows, likewise
        auto kernel = big_rows_kernel<S, T>;
        const int64_t avail = static_cast<int64_t>(props->sharedMemPerBlockOptin) - static_smem(kernel);
        // cap: the (key, anchor) pairs that fit next to the bitmap; -1 when not even the bitmap fits (then every
        // big row takes the recompute path)
        const int64_t room = avail - big_row_smem(A, 0);
        const int64_t cap = room < 0 ? -1 : std::min<int64_t>(A, room / 8);
        const int64_t smem = cap < 0 ? 0 : big_row_smem(A, cap);
        raise_smem_limit(kernel, smem);
        const int64_t grid = std::min<int64_t>(B * M, props->multiProcessorCount * occupancy(kernel, kBigThreads, smem));
        kernel<<<static_cast<unsigned>(grid), kBigThreads, smem, stream>>>(P, cells, notes, claims, w.big_rows,
                                                                            w.big_n, cap);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      }
      // passes 2-3: owners
      resolve_claims_kernel<T><<<blocks_for(B * A), kThreads, 0, stream>>>(
          B * A, A, M, static_cast<int>(topk), w.count, w.claimant, w.claim_align, w.claim_ov, sink, w.owner,
          w.own_align, w.own_ov, w.conflicts, w.n_conf);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      {
        // enough warps to fill the device; each takes conflicted anchors from the list in turn
        const int64_t grid = std::min<int64_t>(props->multiProcessorCount * 8, blocks_for(B * A, kWarps));
        resolve_conflicts_kernel<S, T><<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(
            P, w.conflicts, reinterpret_cast<const int64_t*>(w.n_conf), sink, w.owner, w.own_align, w.own_ov);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      }
      if (second) {
        // pass 4
        second_topk_warp_kernel<S, T><<<blocks_for(B * M, kWarps), kThreads, 0, stream>>>(
            P, notes, w.own_n, w.own_list, w.own_align, w.own_ov, static_cast<int>(topk2), w.keep, w.stats,
            w.slow_rows, w.slow_n);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
        // the other rows: as many blocks as fit on the device at once, each taking rows from the list in turn
        auto kernel = second_topk_rows_kernel<S, T>;
        const int64_t grid = std::min<int64_t>(B * M, props->multiProcessorCount * occupancy(kernel, kThreads, 0));
        kernel<<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(P, notes, w.owner, w.own_align, w.own_ov,
                                                                      static_cast<int>(topk2), w.keep, w.stats,
                                                                      w.slow_rows, w.slow_n);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      }
    });
    // pass 5: the outputs
    const OutputArgs<T> out{w.owner, second ? w.keep : nullptr, w.own_align, w.stats, notes, rows.labels,
                            w.gt, B, M, A, C, static_cast<int>(D), static_cast<T>(eps),
                            target_labels.data_ptr<int64_t>(), target_bboxes.data_ptr<T>(),
                            target_scores.data_ptr<T>(), fg_mask.data_ptr<bool>(), target_gt_idx.data_ptr<int64_t>()};
    if (C < std::numeric_limits<int32_t>::max() / kThreads) {  // 32-bit index math within a block's scores
      outputs_kernel<T, int32_t><<<blocks_for(B * A), kThreads, 0, stream>>>(out);
    } else {
      outputs_kernel<T, int64_t><<<blocks_for(B * A), kThreads, 0, stream>>>(out);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return {target_labels, target_bboxes, target_scores, fg_mask, target_gt_idx};
}

}  // namespace

TORCH_LIBRARY_IMPL(lucid, CUDA, m) { m.impl("assign", &assign_cuda); }

}  // namespace lucid
