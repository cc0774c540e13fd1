// Step 5 on the CPU (only when K2 != K): each row keeps the K2 best of the anchors it owns after step 4, with the
// zero fill of step 3 (every anchor it does not own counts 0), and the rest become background. Images in parallel.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/problem.h"

namespace lucid {
namespace cpu {

template <typename S, typename T>
void second_topk(const Problem<S, T>& P, Workspace<T>& w) {
  const int64_t A = P.A, M = P.M;
  at::parallel_for(0, P.B, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      // the anchors grouped by owner, in increasing anchor order within a row
      std::vector<int64_t> start(M + 1, 0), fill(M, 0), by_row;
      for (int64_t a = 0; a < A; ++a) {
        if (w.owner[b * A + a] >= 0) ++start[w.owner[b * A + a] + 1];
      }
      for (int64_t m = 0; m < M; ++m) start[m + 1] += start[m];
      by_row.resize(start[M]);
      for (int64_t a = 0; a < A; ++a) {
        const int64_t m = w.owner[b * A + a];
        if (m >= 0) by_row[start[m] + fill[m]++] = a;
      }
      for (int64_t m = 0; m < M; ++m) {
        if (start[m + 1] == start[m]) continue;
        const int64_t row = b * M + m;
        RowTopK<T> top(P.K2);
        auto offer_owned = [&](int64_t a) { top.offer({w.own_align[b * A + a], w.own_ov[b * A + a], a}); };
        if (w.nan_seen[row] || w.inf_cand[row]) {
          // the row's other candidates whose metric is not finite stand in as NaN (rules::unowned_stand_in)
          std::vector<Entry<T>> extra;
          auto batch = P.overlap_batch();
          for (int64_t a = 0; a < A; ++a) {
            if (w.owner[b * A + a] == m || !P.candidate(row, a)) continue;
            const int64_t pred = b * A + a;
            T o;
            batch.run(&row, &pred, 1, &o);
            const T v = rules::unowned_stand_in(P.align(row, pred, o));
            if (geom::isnan_(v)) extra.push_back({v, o, a});  // ranks, but is never kept: not the row's
          }
          auto it = extra.begin();
          for (int64_t j = start[m]; j < start[m + 1]; ++j) {
            for (; it != extra.end() && it->anchor < by_row[j]; ++it) top.offer(*it);
            offer_owned(by_row[j]);
          }
          for (; it != extra.end(); ++it) top.offer(*it);
        } else {
          for (int64_t j = start[m]; j < start[m + 1]; ++j) offer_owned(by_row[j]);
        }
        for (int64_t j = start[m]; j < start[m + 1]; ++j) w.owner[b * A + by_row[j]] = -2;  // provisional drop
        const auto owned_begin = by_row.begin() + start[m], owned_end = by_row.begin() + start[m + 1];
        top.chosen(A, [&](const Entry<T>& e) {
          if (std::binary_search(owned_begin, owned_end, e.anchor)) w.owner[b * A + e.anchor] = m;
        });
      }
      for (int64_t a = 0; a < A; ++a) {
        if (w.owner[b * A + a] == -2) w.owner[b * A + a] = -1;
      }
    }
  });
}

}  // namespace cpu
}  // namespace lucid
