// Step 6 on the CPU: per row the maxima of metric and overlap over the anchors it finally owns, whether its image is
// poisoned by non-finite metrics (rules::row_poisoned), then per anchor the outputs: fg, index, label, box and the
// normalised one-hot score. Background anchors take row 0's label and box.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/problem.h"

namespace lucid {
namespace cpu {

template <typename T>
struct Outputs {
  int64_t* labels;  // (B, A)
  T* boxes;         // (B, A, D)
  T* scores;        // (B, A, C), zero-filled
  bool* fg;         // (B, A)
  int64_t* idx;     // (B, A)
};

template <typename S, typename T>
void targets(const Problem<S, T>& P, const Workspace<T>& w, const Outputs<T>& out) {
  const int64_t B = P.B, A = P.A, M = P.M, C = P.C, D = P.D;
  // per row: the maxima over what it owns, the other anchors counting 0
  std::vector<T> best_align(B * M), best_ov(B * M);
  std::vector<uint8_t> poisoned(B, 0);
  at::parallel_for(0, B, 1, [&](int64_t b0, int64_t b1) {
    std::vector<int64_t> owned(M), inf_owned(M);
    for (int64_t b = b0; b < b1; ++b) {
      std::fill(owned.begin(), owned.end(), 0);
      std::fill(inf_owned.begin(), inf_owned.end(), 0);
      std::fill(best_align.begin() + b * M, best_align.begin() + (b + 1) * M, -std::numeric_limits<T>::infinity());
      std::fill(best_ov.begin() + b * M, best_ov.begin() + (b + 1) * M, -std::numeric_limits<T>::infinity());
      for (int64_t a = 0; a < A; ++a) {
        const int64_t m = w.owner[b * A + a];
        if (m < 0) continue;
        ++owned[m];
        inf_owned[m] += std::isinf(w.own_align[b * A + a]);
        best_align[b * M + m] = geom::max_(best_align[b * M + m], w.own_align[b * A + a]);
        best_ov[b * M + m] = geom::max_(best_ov[b * M + m], w.own_ov[b * A + a]);
      }
      for (int64_t m = 0; m < M; ++m) {
        const int64_t row = b * M + m;
        poisoned[b] |= rules::row_poisoned(w.nan_seen[row], w.inf_cand[row], inf_owned[m]);
        best_align[row] = rules::row_max(best_align[row], owned[m] == A);
        best_ov[row] = rules::row_max(best_ov[row], owned[m] == A);
      }
    }
  });
  at::parallel_for(0, B * A, 1024, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t b = i / A;
      const int64_t m = w.owner[i];
      const bool fg = m >= 0;
      const int64_t idx = rules::target_row(m);
      const int64_t row = b * M + idx;
      const int64_t label = rules::target_label(P.labels[row]);
      out.fg[i] = fg;
      out.idx[i] = idx;
      out.labels[i] = label;
      for (int64_t d = 0; d < D; ++d) out.boxes[i * D + d] = P.gt[row * D + d];
      T norm = T(0);
      if (poisoned[b]) {
        norm = rules::poisoned_norm<T>();
      } else if (fg) {
        norm = rules::normalised(w.own_align[i], best_align[row], best_ov[row], P.eps, M > 1);
      }
      if (!std::isfinite(norm)) {  // else the zeros already there (0 * norm is 0 or -0)
        for (int64_t c = 0; c < C; ++c) out.scores[i * C + c] = rules::class_score(fg, c == label, norm);
      } else if (fg) {
        out.scores[i * C + label] = rules::class_score(fg, true, norm);
      }
    }
  });
}

}  // namespace cpu
}  // namespace lucid
