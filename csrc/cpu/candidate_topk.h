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

template <typename S, typename T>
void candidate_topk(const Problem<S, T>& P, Workspace<T>& w) {
  const int64_t A = P.A, M = P.M, K = P.K;
  constexpr int64_t kChunk = 256;  // candidate pairs evaluated per batch
  at::parallel_for(0, P.B * M, 1, [&](int64_t begin, int64_t end) {
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
          w.nan_seen[row] |= geom::isnan_(e.align) || geom::isnan_(e.overlap);
          w.inf_cand[row] += std::isinf(e.align);
          top.offer(e);
        }
        n = 0;
      };
      for (int64_t a = 0; a < A; ++a) {
        if (!P.inside(row, a)) continue;  // metric 0, not a candidate
        pi[n++] = b * A + a;
        if (n == kChunk) flush();
      }
      flush();
      Entry<T>* out = w.claims.data() + row * K;
      int64_t taken = 0;
      top.chosen(A, [&](const Entry<T>& e) { out[taken++] = e; });
      w.claim_n[row] = taken;
    }
  });
}

}  // namespace cpu
}  // namespace lucid
