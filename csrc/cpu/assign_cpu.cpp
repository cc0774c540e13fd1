// torch.ops.lucid.assign on the CPU: SPEC.md steps 1-8 without any (B, M, A) tensor.
//
// Working memory beyond the outputs: per-object claim lists (B*M*K), per-anchor counters, owners and the owner's
// metric and overlap (B*A), per-object maxima (B*M), and per-box prepared values (B*M + B*A).
//
// Passes (images and objects in parallel with at::parallel_for):
//  1 candidates  each real object scans all anchors: containment, metric and overlap of the inside ones; keeps its
//                top K by (metric desc, index asc) over all A anchors, where the anchors outside have metric 0, so
//                that when fewer than K metrics are positive the lowest-indexed zero-metric anchors fill the list
//                (DESIGN.md trap 1); the filled anchors that lie inside become claims.
//  2 claims      per image, count the claims of each anchor and remember the claimant.
//  3 conflicts   an anchor claimed more than once goes to the row with the largest overlap over all M rows,
//                recomputed, 0 for padding rows and rows that do not contain it (trap 2).
//  4 top-k2      (K2 != K) each row keeps the K2 best of what it now owns, with the same zero fill (trap 3).
//  5 maxima      per row, max metric and max overlap over what it finally owns (trap 4).
//  6 targets     per anchor: fg, index, label, box and the scaled one-hot score; background rows get row 0 (trap 5).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "checks.h"
#include "cpu/pair_metrics_cpu.h"
#include "geometry.h"

namespace lucid {
namespace {

// Ranking of SPEC step 3: larger metric first, NaN above every number, ties to the lower anchor index.
template <typename T>
inline bool ranks_before(T va, int64_t ia, T vb, int64_t ib) {
  const bool na = geom::isnan_(va), nb = geom::isnan_(vb);
  if (na || nb) return na && nb ? ia < ib : na;
  if (va != vb) return va > vb;
  return ia < ib;
}

template <typename T>
struct Entry {
  T align;
  T overlap;
  int64_t anchor;
  bool kept = true;  // false: takes part in a selection without being kept (second top-k, non-finite metrics)
};

// Keeps the k best entries (by ranks_before) seen so far; the worst one sits at the heap's top.
template <typename T>
class BestK {
 public:
  explicit BestK(int64_t k) : k_(k) { heap_.reserve(k); }
  void offer(const Entry<T>& e) {
    if (static_cast<int64_t>(heap_.size()) < k_) {
      heap_.push_back(e);
      std::push_heap(heap_.begin(), heap_.end(), cmp);
    } else if (k_ > 0 && ranks_before(e.align, e.anchor, heap_.front().align, heap_.front().anchor)) {
      std::pop_heap(heap_.begin(), heap_.end(), cmp);
      heap_.back() = e;
      std::push_heap(heap_.begin(), heap_.end(), cmp);
    }
  }
  int64_t size() const { return static_cast<int64_t>(heap_.size()); }
  // The best n entries, best first.
  std::vector<Entry<T>> best(int64_t n) {
    std::sort(heap_.begin(), heap_.end(), cmp);
    heap_.resize(std::min<int64_t>(n, size()));
    return heap_;
  }

 private:
  static bool cmp(const Entry<T>& x, const Entry<T>& y) { return ranks_before(x.align, x.anchor, y.align, y.anchor); }
  int64_t k_;
  std::vector<Entry<T>> heap_;
};

// Top-k over a row of A anchors whose metric is 0 except at the entries offered (in increasing anchor order).
// Entries with metric exactly 0 (and every anchor not offered) are "zero" anchors: they rank after the positive
// (or NaN) metrics, among themselves by index, and before the negative metrics.
template <typename T>
class RowTopK {
 public:
  explicit RowTopK(int64_t k) : k_(k), pos_(k), neg_(k) {}
  // Entries must come in increasing anchor order.
  void offer(const Entry<T>& e) {
    if (geom::isnan_(e.align) || e.align > T(0)) {
      pos_.offer(e);
      ++nonzero_;
    } else if (e.align < T(0)) {
      neg_.offer(e);
      ++nonzero_;
    } else {
      const int64_t rank = e.anchor - nonzero_;  // zero anchors before it: every lower anchor not nonzero
      if (rank < k_) zero_.push_back({e, rank});
    }
  }
  // Chosen entries among those offered. total_anchors: A.
  template <typename F>
  void chosen(int64_t total_anchors, F&& take) {
    const int64_t n_pos = std::min(k_, pos_.size());
    for (const auto& e : pos_.best(n_pos)) take(e);
    const int64_t room = k_ - n_pos;
    for (const auto& z : zero_) {
      if (z.rank < room) take(z.entry);
    }
    const int64_t zeros_total = total_anchors - nonzero_;
    if (room > zeros_total) {
      for (const auto& e : neg_.best(room - zeros_total)) take(e);
    }
  }

 private:
  struct Zero {
    Entry<T> entry;
    int64_t rank;
  };
  int64_t k_;
  int64_t nonzero_ = 0;
  BestK<T> pos_, neg_;
  std::vector<Zero> zero_;
};

template <typename S, typename T>
struct AssignCpu {
  // inputs
  const S* scores;  // (B, A, C) contiguous
  const T* pd;      // (B, A, D)
  const T* anc;     // (A, 2)
  const T* gt;      // (B, M, D)
  const int64_t* labels;  // (B, M)
  const bool* valid;      // (B, M)
  int64_t B, A, C, M, D, K, K2;
  double alpha, beta;
  T eps;
  cpu::BoxPrep<T> gprep, pprep;
  cpu::Regions<T> regions;

  bool candidate(int64_t row, int64_t a) const {
    return valid[row] && regions.contains(row, anc[2 * a], anc[2 * a + 1]);
  }

  // Metric of a candidate pair from its overlap: s^alpha * o^beta with s the score of the row's class.
  T align(int64_t row, int64_t pred, T overlap) const {
    return geom::mul(cpu::score_pow<S, T>(scores[pred * C + labels[row]], alpha), geom::pow_scalar(overlap, beta));
  }

  cpu::OverlapBatch<T> overlap_batch() const { return cpu::OverlapBatch<T>(gt, gprep, pd, pprep, D); }
};

template <typename S, typename T>
void run_assign(AssignCpu<S, T>& P, int64_t* out_labels, T* out_boxes, T* out_scores, bool* out_fg, int64_t* out_idx) {
  const int64_t B = P.B, A = P.A, M = P.M, K = P.K, C = P.C, D = P.D;

  // ---- pass 1: claims, B*M*K; and per row, what step 8 and the second top-k need to know about non-finite
  // metrics (geometry.h, step 8 with non-finite metrics): whether a candidate pair has a NaN metric or overlap, and how many have an infinite
  // metric
  std::vector<int64_t> claim_n(B * M, 0);
  std::vector<uint8_t> nan_seen(B * M, 0);
  std::vector<int64_t> inf_cand(B * M, 0);
  std::vector<Entry<T>> claims(B * M * K);
  constexpr int64_t kChunk = 256;  // candidate pairs evaluated per batch
  at::parallel_for(0, B * M, 1, [&](int64_t begin, int64_t end) {
    auto batch = P.overlap_batch();
    std::vector<int64_t> gi(kChunk), pi(kChunk);
    std::vector<T> ov(kChunk);
    for (int64_t row = begin; row < end; ++row) {
      if (!P.valid[row]) continue;
      const int64_t b = row / M;
      RowTopK<T> top(K);
      std::fill(gi.begin(), gi.end(), row);
      int64_t n = 0;
      auto flush = [&] {
        batch.run(gi.data(), pi.data(), n, ov.data());
        for (int64_t k = 0; k < n; ++k) {
          const Entry<T> e{P.align(row, pi[k], ov[k]), ov[k], pi[k] - b * A};
          nan_seen[row] |= geom::isnan_(e.align) || geom::isnan_(e.overlap);
          inf_cand[row] += std::isinf(e.align);
          top.offer(e);
        }
        n = 0;
      };
      for (int64_t a = 0; a < A; ++a) {
        if (!P.regions.contains(row, P.anc[2 * a], P.anc[2 * a + 1])) continue;  // metric 0, not a candidate
        pi[n++] = b * A + a;
        if (n == kChunk) flush();
      }
      flush();
      Entry<T>* out = claims.data() + row * K;
      int64_t taken = 0;
      top.chosen(A, [&](const Entry<T>& e) { out[taken++] = e; });
      claim_n[row] = taken;
    }
  });

  // ---- passes 2-3: owners, B*A
  std::vector<int64_t> owner(B * A, -1);
  std::vector<T> own_align(B * A, T(0)), own_ov(B * A, T(0));
  at::parallel_for(0, B, 1, [&](int64_t b0, int64_t b1) {
    std::vector<int32_t> count(A);
    std::vector<int64_t> slot(A), rows(M), preds(M);
    std::vector<T> ov(M);
    auto batch = P.overlap_batch();
    for (int64_t b = b0; b < b1; ++b) {
      std::fill(count.begin(), count.end(), 0);
      for (int64_t m = 0; m < M; ++m) {
        const int64_t row = b * M + m;
        for (int64_t k = 0; k < claim_n[row]; ++k) {
          const int64_t a = claims[row * K + k].anchor;
          if (++count[a] == 1) slot[a] = row * K + k;
        }
      }
      for (int64_t a = 0; a < A; ++a) {
        const int64_t i = b * A + a;
        if (count[a] == 1) {
          const auto& e = claims[slot[a]];
          owner[i] = slot[a] / K - b * M;
          own_align[i] = e.align;
          own_ov[i] = e.overlap;
        } else if (count[a] > 1) {
          // overlaps of every row at this anchor (0 where not a candidate), then the first maximum over the rows;
          // NaN counts as the maximum (torch.argmax)
          int64_t n = 0;
          for (int64_t m = 0; m < M; ++m) {
            if (P.candidate(b * M + m, a)) {
              rows[n] = b * M + m;
              preds[n++] = i;
            }
          }
          batch.run(rows.data(), preds.data(), n, ov.data());
          int64_t best = 0, best_k = -1, k = 0;
          T best_v = T(0);
          for (int64_t m = 0; m < M; ++m) {
            const bool cand = k < n && rows[k] == b * M + m;
            const T v = cand ? ov[k] : T(0);
            if (m == 0 || (!geom::isnan_(best_v) && (geom::isnan_(v) || v > best_v))) {
              best = m;
              best_v = v;
              best_k = cand ? k : -1;
            }
            k += cand;
          }
          owner[i] = best;
          own_ov[i] = best_v;
          own_align[i] = best_k >= 0 ? P.align(b * M + best, i, best_v) : T(0);
        }
      }
    }
  });

  // ---- pass 4: second top-k over what each row owns
  std::vector<int64_t> owned_count(B * M, 0);
  if (P.K2 != K) {
    at::parallel_for(0, B, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        // anchors grouped by owner, increasing anchor order within a row
        std::vector<int64_t> start(M + 1, 0), fill(M, 0), by_row;
        for (int64_t a = 0; a < A; ++a) {
          if (owner[b * A + a] >= 0) ++start[owner[b * A + a] + 1];
        }
        for (int64_t m = 0; m < M; ++m) start[m + 1] += start[m];
        by_row.resize(start[M]);
        for (int64_t a = 0; a < A; ++a) {
          const int64_t m = owner[b * A + a];
          if (m >= 0) by_row[start[m] + fill[m]++] = a;
        }
        for (int64_t m = 0; m < M; ++m) {
          if (start[m + 1] == start[m]) continue;
          const int64_t row = b * M + m;
          RowTopK<T> top(P.K2);
          if (nan_seen[row] || inf_cand[row]) {
            // the row's other candidates whose metric is not finite rank as NaN (align * 0): they take places in
            // the selection without being kept
            std::vector<Entry<T>> extra;
            auto batch = P.overlap_batch();
            for (int64_t a = 0; a < A; ++a) {
              if (owner[b * A + a] == m || !P.candidate(row, a)) continue;
              const int64_t pred = b * A + a;
              T o;
              batch.run(&row, &pred, 1, &o);
              const T al = P.align(row, pred, o);
              if (!std::isfinite(al)) extra.push_back({std::numeric_limits<T>::quiet_NaN(), o, a, /*kept=*/false});
            }
            auto it = extra.begin();
            for (int64_t j = start[m]; j < start[m + 1]; ++j) {
              const int64_t a = by_row[j];
              for (; it != extra.end() && it->anchor < a; ++it) top.offer(*it);
              top.offer({own_align[b * A + a], own_ov[b * A + a], a});
            }
            for (; it != extra.end(); ++it) top.offer(*it);
          } else {
            for (int64_t j = start[m]; j < start[m + 1]; ++j) {
              const int64_t a = by_row[j];
              top.offer({own_align[b * A + a], own_ov[b * A + a], a});
            }
          }
          for (int64_t j = start[m]; j < start[m + 1]; ++j) owner[b * A + by_row[j]] = -2;  // provisional drop
          top.chosen(A, [&](const Entry<T>& e) {
            if (e.kept) owner[b * A + e.anchor] = m;
          });
        }
        for (int64_t a = 0; a < A; ++a) {
          if (owner[b * A + a] == -2) owner[b * A + a] = -1;
        }
      }
    });
  }

  // ---- pass 5: per-row maxima over the final owners (the row's other anchors contribute 0); an image is
  // poisoned (every normalised metric NaN) when a row's maximum would be NaN in the dense form
  std::vector<T> best_align(B * M), best_ov(B * M);
  std::vector<uint8_t> poisoned(B, 0);
  at::parallel_for(0, B, 1, [&](int64_t b0, int64_t b1) {
    std::vector<int64_t> inf_owned(M);
    for (int64_t b = b0; b < b1; ++b) {
      std::fill(inf_owned.begin(), inf_owned.end(), 0);
      for (int64_t a = 0; a < A; ++a) {
        if (owner[b * A + a] >= 0) {
          ++owned_count[b * M + owner[b * A + a]];
          inf_owned[owner[b * A + a]] += std::isinf(own_align[b * A + a]);
        }
      }
      for (int64_t m = 0; m < M; ++m) {
        poisoned[b] |= geom::row_poisoned(nan_seen[b * M + m], inf_cand[b * M + m], inf_owned[m]);
      }
      for (int64_t m = 0; m < M; ++m) {
        const bool has_zero = owned_count[b * M + m] < A;
        best_align[b * M + m] = has_zero ? T(0) : -std::numeric_limits<T>::infinity();
        best_ov[b * M + m] = has_zero ? T(0) : -std::numeric_limits<T>::infinity();
      }
      for (int64_t a = 0; a < A; ++a) {
        const int64_t m = owner[b * A + a];
        if (m < 0) continue;
        best_align[b * M + m] = geom::max_(best_align[b * M + m], own_align[b * A + a]);
        best_ov[b * M + m] = geom::max_(best_ov[b * M + m], own_ov[b * A + a]);
      }
    }
  });

  // ---- pass 6: targets
  at::parallel_for(0, B * A, 1024, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t b = i / A;
      const int64_t m = owner[i];
      const bool fg = m >= 0;
      const int64_t idx = fg ? m : 0;
      const int64_t row = b * M + idx;
      const int64_t label = std::max<int64_t>(P.labels[row], 0);
      out_fg[i] = fg;
      out_idx[i] = idx;
      out_labels[i] = label;
      for (int64_t d = 0; d < D; ++d) out_boxes[i * D + d] = P.gt[row * D + d];
      T norm = T(0);
      if (poisoned[b]) {
        norm = std::numeric_limits<T>::quiet_NaN();
      } else if (fg) {
        // the owner's normalised metric; every other row contributes 0 to the maximum over rows
        norm = geom::div(geom::mul(own_align[i], best_ov[row]), geom::add(best_align[row], P.eps));
        if (M > 1) norm = geom::max_(norm, T(0));
      }
      // scores = one-hot * norm: 0 * norm off the label (NaN when norm is not finite)
      if (!std::isfinite(norm)) {
        for (int64_t c = 0; c < C; ++c) out_scores[i * C + c] = geom::mul(T(0), norm);
      }
      if (fg) out_scores[i * C + label] = norm;
    }
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> assign_cpu(
    const at::Tensor& pd_scores, const at::Tensor& pd_bboxes, const at::Tensor& anc_points, const at::Tensor& gt_labels,
    const at::Tensor& gt_bboxes, const at::Tensor& mask_gt, int64_t topk, int64_t topk2, int64_t num_classes,
    double alpha, double beta, double eps, double stride_val) {
  const int64_t D = check_assign_args(pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt, topk, topk2,
                                      num_classes, stride_val);
  const int64_t B = pd_scores.size(0), A = pd_scores.size(1), C = pd_scores.size(2), M = gt_bboxes.size(1);
  const auto box_t = gt_bboxes.scalar_type();
  auto opts = pd_scores.options();
  auto target_labels = at::empty({B, A}, opts.dtype(at::kLong));
  auto target_bboxes = at::empty({B, A, D}, opts.dtype(box_t));
  auto target_scores = at::zeros({B, A, C}, opts.dtype(box_t));
  auto fg_mask = at::empty({B, A}, opts.dtype(at::kBool));
  auto target_gt_idx = at::empty({B, A}, opts.dtype(at::kLong));
  if (M == 0) {  // SPEC: every anchor is background
    target_labels.fill_(num_classes);
    target_bboxes.zero_();
    fg_mask.zero_();
    target_gt_idx.zero_();
    return {target_labels, target_bboxes, target_scores, fg_mask, target_gt_idx};
  }
  const auto valid = mask_gt.reshape({B, M}).ne(0).contiguous();
  const auto labels = gt_labels.reshape({B, M}).to(at::kLong).contiguous();
  {
    const auto bad = valid & ((labels < 0) | (labels >= C));
    TORCH_CHECK(!bad.any().item<bool>(), "gt_labels: real objects (mask_gt != 0) must have labels in [0, ", C,
                "); found ", labels.masked_select(bad).slice(0, 0, 5), " (first five)");
  }
  const auto scores = pd_scores.contiguous();
  // anchors of a narrower float type (checked) widen exactly
  const auto pd = pd_bboxes.contiguous(), gt = gt_bboxes.contiguous();
  const auto anc = anc_points.to(gt_bboxes.scalar_type()).contiguous();
  AT_DISPATCH_FLOATING_TYPES(box_t, "assign_cpu", [&] {
    using T = scalar_t;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, scores.scalar_type(), "assign_cpu_scores", [&] {
      using S = scalar_t;
      AssignCpu<S, T> P{scores.data_ptr<S>(),
                        pd.data_ptr<T>(),
                        anc.data_ptr<T>(),
                        gt.data_ptr<T>(),
                        labels.data_ptr<int64_t>(),
                        valid.data_ptr<bool>(),
                        B, A, C, M, D, topk, topk2, alpha, beta, static_cast<T>(eps),
                        cpu::BoxPrep<T>::make(gt),
                        cpu::BoxPrep<T>::make(pd),
                        cpu::Regions<T>::make(gt, valid.data_ptr<bool>(), static_cast<T>(stride_val))};
      run_assign<S, T>(P, target_labels.data_ptr<int64_t>(), target_bboxes.data_ptr<T>(),
                       target_scores.data_ptr<T>(), fg_mask.data_ptr<bool>(), target_gt_idx.data_ptr<int64_t>());
    });
  });
  return {target_labels, target_bboxes, target_scores, fg_mask, target_gt_idx};
}

}  // namespace

TORCH_LIBRARY_IMPL(lucid, CPU, m) { m.impl("assign", &assign_cpu); }

}  // namespace lucid
