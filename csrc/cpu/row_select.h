// The top-k of one row on the CPU, for steps 3 and 5: the k best of a row's A anchors by rules::ranks_before, where
// only some anchors are offered explicitly and every other one has metric 0 (the zero fill of docs/spec.md).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "rules.h"

namespace lucid {
namespace cpu {

template <typename T>
using Entry = rules::Entry<T, int64_t>;

// Keeps the k best entries (by ranks_before) seen so far; the worst one sits at the heap's top.
template <typename T>
class BestK {
 public:
  explicit BestK(int64_t k) : k_(k) { heap_.reserve(k); }
  void offer(const Entry<T>& e) {
    if (static_cast<int64_t>(heap_.size()) < k_) {
      heap_.push_back(e);
      std::push_heap(heap_.begin(), heap_.end(), cmp);
    } else if (k_ > 0 && rules::ranks_before(e, heap_.front())) {
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
  static bool cmp(const Entry<T>& x, const Entry<T>& y) { return rules::ranks_before(x, y); }
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

}  // namespace cpu
}  // namespace lucid
