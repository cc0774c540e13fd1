// Steps 1-3 on the CPU, fused: each real object row scans all A anchors (containment), computes the overlap and
// metric of those inside (in batches, so that ATen's math functions see the same values as the reference's) and
// keeps its top K over all A anchors, where the anchors outside have metric 0 (the zero fill of docs/spec.md: when
// fewer than K metrics are positive the lowest-indexed zero-metric anchors fill the list). The chosen anchors that
// lie inside become the row's claims. Rows in parallel.
#pragma once

#include <ATen/Parallel.h>

#include <cmath>
#include <vector>

#include "cpu/problem.h"

namespace lucid {
namespace cpu {

// The row scan of steps 1-3: every real row's candidates in anchor order, their overlaps in batches (from `batch`,
// made per thread), their entries from make(row, b, pred, overlap), and the row's top k over all A anchors handed to
// done(row, top).
template <typename S, typename T, typename Batch, typename Make, typename Done>
void scan_rows(const Problem<S, T>& P, Batch batch_of, int64_t k, Make make, Done done) {
  const int64_t A = P.A, M = P.M;
  constexpr int64_t kChunk = 256;  // candidate pairs evaluated per batch
  at::parallel_for(0, P.B * M, 1, [&](int64_t begin, int64_t end) {
    auto batch = batch_of();
    std::vector<int64_t> gi(kChunk), pi(kChunk);
    std::vector<T> ov(kChunk);
    for (int64_t row = begin; row < end; ++row) {
      if (!P.valid[row]) continue;
      const int64_t b = row / M;
      RowTopK<T> top(k);
      std::fill(gi.begin(), gi.end(), row);
      int64_t n = 0;
      auto flush = [&] {
        batch.run(gi.data(), pi.data(), n, ov.data());
        for (int64_t j = 0; j < n; ++j) top.offer(make(row, b, pi[j], ov[j]));
        n = 0;
      };
      for (int64_t a = 0; a < A; ++a) {
        if (!P.inside(row, a)) continue;  // metric 0, not a candidate
        pi[n++] = b * A + a;
        if (n == kChunk) flush();
      }
      flush();
      done(row, top);
    }
  });
}

template <typename S, typename T>
void candidate_topk(const Problem<S, T>& P, Workspace<T>& w) {
  const int64_t A = P.A, K = P.K;
  scan_rows(
      P, [&] { return P.overlap_batch(); }, K,
      [&](int64_t row, int64_t b, int64_t pred, T overlap) {
        const Entry<T> e{P.align(row, pred, overlap), overlap, pred - b * A};
        w.nan_seen[row] |= geom::isnan_(e.align) || geom::isnan_(e.overlap);
        w.inf_cand[row] += std::isinf(e.align);
        return e;
      },
      [&](int64_t row, RowTopK<T>& top) {
        Entry<T>* out = w.claims.data() + row * K;
        int64_t taken = 0;
        top.chosen(A, [&](const Entry<T>& e) { out[taken++] = e; });
        w.claim_n[row] = taken;
      });
}

// Segmentation, step 2 (docs/spec.md, "Segmentation"): each real row's min(3K, A) best pairs by box metric plus eps
// (the same top-k over all A anchors), into seg.n and seg.anchors (increasing).
template <typename S, typename T>
void choose_mask_pairs(const Problem<S, T>& P, SegRows<T>& seg) {
  const int64_t A = P.A;
  scan_rows(
      P, [&] { return P.box_overlap_batch(); }, seg.K3,
      [&](int64_t row, int64_t b, int64_t pred, T overlap) {
        return Entry<T>{rules::mask_choice_metric(P.align(row, pred, overlap), P.eps), overlap, pred - b * A};
      },
      [&](int64_t row, RowTopK<T>& top) {
        int64_t* out = seg.anchors.data() + row * seg.K3;
        int64_t taken = 0;
        top.chosen(A, [&](const Entry<T>& e) { out[taken++] = e.anchor; });
        std::sort(out, out + taken);
        seg.n[row] = taken;
      });
}

}  // namespace cpu
}  // namespace lucid
