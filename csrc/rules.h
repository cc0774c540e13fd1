// The assignment's rules on single values, shared by the CPU and CUDA passes: torch-free, header-only, host and
// device. Each is a step of docs/spec.md, computed as the reference computes it (lucid_assign/reference.py), with
// the separately rounded arithmetic of geometry.h. A CPU pass and a CUDA pass that apply the same rule call the same
// function here, so the backends agree by construction.
#pragma once

#include <cstdint>
#include <cstring>

#include "geometry.h"

namespace lucid {
namespace rules {

// ---- step 2, the metric ----------------------------------------------------------------------------------------
// s.pow(alpha) for a score s of dtype S, in the op math type T: PyTorch first rounds the exponent to S (0.7 becomes
// 0.7002 in float16), computes in T and rounds the result to S. in_float32: the power under CUDA autocast (amp.h),
// which runs pow in float32 on the widened score with a float32 exponent.
template <typename S, typename T>
LUCID_HD T score_pow(S s, double alpha, bool in_float32 = false) {
  if (in_float32) return geom::pow_scalar(static_cast<T>(s), static_cast<double>(static_cast<float>(alpha)));
  const double e = static_cast<double>(static_cast<S>(alpha));
  return static_cast<T>(static_cast<S>(geom::pow_scalar(static_cast<T>(s), e)));
}

// align = s^alpha * o^beta of a candidate pair.
template <typename S, typename T>
LUCID_HD T align_metric(S s, T overlap, double alpha, double beta, bool pow_in_float32 = false) {
  return geom::mul(score_pow<S, T>(s, alpha, pow_in_float32), geom::pow_scalar(overlap, beta));
}

// Segmentation: the metric by which each object's pairs that get a mask IoU are chosen (its min(3K, A) best), the
// pair's box metric plus eps.
template <typename T>
LUCID_HD T mask_choice_metric(T box_align, T eps) {
  return geom::add(box_align, eps);
}

// ---- steps 3-5, ranking ----------------------------------------------------------------------------------------
// Whether value v at index i ranks before value w at index j: the larger first, NaN above every number (NaNs tie
// with each other), ties to the lower index. The order of both top-k selections (steps 3 and 5), and the first
// maximum of step 4's argmax over the rows (torch.argmax: NaN is the maximum, the first one wins).
template <typename T>
LUCID_HD bool ranks_before(T v, int64_t i, T w, int64_t j) {
  const bool nv = geom::isnan_(v), nw = geom::isnan_(w);
  if (nv || nw) return nv && nw ? i < j : nv;
  if (v != w) return v > w;
  return i < j;
}

// A candidate pair of a row as both top-k selections see it: its metric, its overlap and its anchor. The CPU ranks
// entries by ranks_before; the CUDA passes add the metric's order key (cuda/problem.cuh's KeyedEntry).
template <typename T, typename Index>
struct Entry {
  T align;
  T overlap;
  Index anchor;
};
template <typename T, typename Index>
LUCID_HD bool ranks_before(const Entry<T, Index>& x, const Entry<T, Index>& y) {
  return ranks_before(x.align, static_cast<int64_t>(x.anchor), y.align, static_cast<int64_t>(y.anchor));
}

// ranks_before as unsigned integers, for the CUDA passes (integer atomicMax and radix selection, whose results do not
// depend on the order of the offers). order_key(v) > order_key(w) exactly when v ranks before w by value, and the
// keys are equal when the values tie: every NaN the largest key, -0 and +0 one key (kZeroKey), denormals and
// infinities in their place. No float gets key 0, which the passes use as "below every number".
constexpr uint32_t kNanKey = 0xFFFFFFFFu;
constexpr uint32_t kZeroKey = 0x80000000u;

LUCID_HD uint32_t float_bits(float v) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(v);
#else
  uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
#endif
}
LUCID_HD float bits_float(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float v;
  std::memcpy(&v, &b, sizeof v);
  return v;
#endif
}

LUCID_HD uint32_t order_key(float v) {
  if (geom::isnan_(v)) return kNanKey;
  if (v == 0.0f) return kZeroKey;
  const uint32_t bits = float_bits(v);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}
// The value of a key: order_key(key_value(order_key(v))) == order_key(v); NaN for kNanKey, +0 for kZeroKey.
LUCID_HD float key_value(uint32_t k) {
  if (k == kNanKey) return bits_float(0x7fc00000u);
  return bits_float((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k);
}

// A value with its row (< 2^32) as one key: larger exactly when ranks_before(v, row, w, other_row), so the largest
// key of an anchor's offers (integer atomicMax) is its first maximum (FirstMax).
LUCID_HD uint64_t row_key(float v, uint32_t row) {
  return (static_cast<uint64_t>(order_key(v)) << 32) | (0xFFFFFFFFu - row);
}
LUCID_HD uint32_t row_of_key(uint64_t key) { return 0xFFFFFFFFu - static_cast<uint32_t>(key & 0xFFFFFFFFu); }
LUCID_HD uint32_t value_key_of(uint64_t key) { return static_cast<uint32_t>(key >> 32); }

// The first maximum of values offered with their indices, in any order (argmax with NaN as the maximum).
template <typename T>
struct FirstMax {
  T value = T(0);
  int64_t index = -1;  // -1: nothing offered yet
  LUCID_HD void offer(T v, int64_t i) {
    if (index < 0 || ranks_before(v, i, value, index)) {
      value = v;
      index = i;
    }
  }
};

// ---- step 4, conflicts, in the dense form --------------------------------------------------------------------
// One anchor of the (B, M, A) tensors: mask, overlaps and out hold its M rows at a distance of `stride`. An anchor
// positive for two or more rows keeps only the first row with the largest overlap over all M rows; out must
// already hold the mask.
template <typename T>
LUCID_HD void resolve_anchor(const bool* mask, const T* overlaps, int64_t M, int64_t stride, bool* out) {
  int count = 0;
  for (int64_t m = 0; m < M && count < 2; ++m) count += mask[m * stride];
  if (count < 2) return;
  FirstMax<T> best;
  for (int64_t m = 0; m < M; ++m) best.offer(overlaps[m * stride], m);
  for (int64_t m = 0; m < M; ++m) out[m * stride] = m == best.index;
}

// ---- step 5, non-finite metrics -----------------------------------------------------------------------------
// In the dense form a row's second top-k ranks align * (owned) over all A anchors, so a candidate pair the row does
// not own stands in as align * 0: NaN when its metric is not finite, which then takes a place in the selection
// without being kept. The pair's stand-in value; it takes part exactly when that is NaN.
template <typename T>
LUCID_HD T unowned_stand_in(T align) {
  return geom::mul(align, T(0));
}

// ---- step 6, normalised scores ---------------------------------------------------------------------------------
// A row's maximum (of metric or overlap) over all A anchors from its maximum over the anchors it owns: the anchors
// it does not own count 0.
template <typename T>
LUCID_HD T row_max(T owned_max, bool owns_every_anchor) {
  return owns_every_anchor ? owned_max : geom::max_(owned_max, T(0));
}

// An owned anchor's score: align * po / (pa + eps) (multiplied first), with pa, po the row maxima; with two or more
// rows, the maximum over the rows includes the 0 of every row that does not own the anchor.
template <typename T>
LUCID_HD T normalised(T align, T pa, T po, T eps, bool several_rows) {
  const T n = geom::div(geom::mul(align, po), geom::add(pa, eps));
  return several_rows ? geom::max_(n, T(0)) : n;
}

// The scores are one-hot * norm: off the label 0 * norm, which is NaN when norm is not finite.
template <typename T>
LUCID_HD T off_label_score(T norm) {
  return geom::mul(T(0), norm);
}

// One anchor's targets: its owner's row, or row 0 of its image when it is background (owner < 0); the label of that
// row, a negative label (a padding row's) read as 0; its normalised metric (norm: 0 for background, NaN when its image
// is poisoned) in the label's class when it is foreground, off_label_score(norm) in every other class.
LUCID_HD int64_t target_row(int64_t owner) { return owner >= 0 ? owner : 0; }
LUCID_HD int64_t target_label(int64_t label) { return label < 0 ? 0 : label; }
template <typename T>
LUCID_HD T poisoned_norm() {
  return static_cast<T>(bits_float(0x7fc00000u));  // a quiet NaN
}
template <typename T>
LUCID_HD T class_score(bool fg, bool label_class, T norm) {
  return fg && label_class ? norm : off_label_score(norm);
}

// Non-finite metrics. In the dense form of step 6 the metric and overlap of every candidate pair are multiplied by
// the positive mask (align' = align * pos), so a non-positive pair with a NaN or infinite metric, or a NaN overlap,
// gives NaN, and the row maxima pa, po become NaN; then align' * po / (pa + eps) is NaN for every anchor of the
// image and so is every normalised metric (and every score: one-hot * NaN). A row is poisoned so when a candidate
// pair has a NaN metric or overlap, or more of its candidate pairs have an infinite metric than of the pairs it
// finally owns.
LUCID_HD bool row_poisoned(bool nan_seen, int64_t inf_candidates, int64_t inf_owned) {
  return nan_seen || inf_candidates > inf_owned;
}

}  // namespace rules
}  // namespace lucid
