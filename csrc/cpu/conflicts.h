// Step 4 on the CPU, in the fused assignment: per image, count the claims of each anchor; an anchor claimed once goes
// to its claimant, an anchor claimed more than once to the first row with the largest overlap over all M rows,
// recomputed, 0 for padding rows and rows that do not contain it (it may be a row that did not claim it). Images in
// parallel. The dense form (the op resolve_conflicts) is resolve_conflicts.cpp; both rank by rules::FirstMax.
#pragma once

#include <ATen/Parallel.h>

#include <vector>

#include "cpu/problem.h"

namespace lucid {
namespace cpu {

template <typename S, typename T>
void resolve_owners(const Problem<S, T>& P, Workspace<T>& w) {
  const int64_t A = P.A, M = P.M, K = P.K;
  at::parallel_for(0, P.B, 1, [&](int64_t b0, int64_t b1) {
    std::vector<int32_t> count(A);
    std::vector<int64_t> slot(A), rows(M), preds(M);
    std::vector<T> ov(M);
    auto batch = P.overlap_batch();
    for (int64_t b = b0; b < b1; ++b) {
      std::fill(count.begin(), count.end(), 0);
      for (int64_t m = 0; m < M; ++m) {
        const int64_t row = b * M + m;
        for (int64_t k = 0; k < w.claim_n[row]; ++k) {
          const int64_t a = w.claims[row * K + k].anchor;
          if (++count[a] == 1) slot[a] = row * K + k;
        }
      }
      for (int64_t a = 0; a < A; ++a) {
        const int64_t i = b * A + a;
        if (count[a] == 1) {
          const auto& e = w.claims[slot[a]];
          w.owner[i] = slot[a] / K - b * M;
          w.own_align[i] = e.align;
          w.own_ov[i] = e.overlap;
        } else if (count[a] > 1) {
          // the overlaps of every row at this anchor (0 where it is not a candidate), then their first maximum
          int64_t n = 0;
          for (int64_t m = 0; m < M; ++m) {
            if (P.candidate(b * M + m, a)) {
              rows[n] = b * M + m;
              preds[n++] = i;
            }
          }
          batch.run(rows.data(), preds.data(), n, ov.data());
          rules::FirstMax<T> best;
          int64_t best_k = -1;
          for (int64_t m = 0, k = 0; m < M; ++m) {
            const bool cand = k < n && rows[k] == b * M + m;
            best.offer(cand ? ov[k] : T(0), m);
            if (best.index == m) best_k = cand ? k : -1;
            k += cand;
          }
          w.owner[i] = best.index;
          w.own_ov[i] = best.value;
          w.own_align[i] = best_k >= 0 ? P.align(b * M + best.index, i, best.value) : T(0);
        }
      }
    }
  });
}

}  // namespace cpu
}  // namespace lucid
