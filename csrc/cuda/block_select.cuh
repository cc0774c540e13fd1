// The top-k of one row over all A anchors on the GPU, for steps 3 and 5: explicit entries (candidates, or owned
// anchors) come from a Source in increasing anchor order, and every other anchor of the row has metric 0 (key
// kZeroKey, the zero fill of docs/spec.md). The order is rules::ranks_before, encoded in the order keys of
// problem.cuh. A block selects by a radix select on the keys and a walk in anchor order (select_row); a warp ranks a
// short list directly (list_ranks).
#pragma once

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <climits>
#include <cstdint>

#include "cuda/problem.cuh"

namespace lucid {
namespace gpu {

// The shared state of a block's selection.
struct RadixState {
  int hist[256];
  uint32_t prefix;
  int k_rem;
  int eq;  // anchors with exactly the k-th key (explicit and implicit), or -1 when fewer than k anchors
  int n;
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
  __device__ bool get(int64_t i, KeyedEntry<T>& e) const {
    e.key = keys[i];
    e.anchor = anchors[i];
    return true;
  }
};

// Radix select of the k-th largest key among the explicit entries plus `implicit` anchors of key kZeroKey.
// for_each_key(f) calls f(active, key) for this thread's share of the explicit entries, in any order, with all 32
// lanes of a warp calling together (active false on lanes without an entry). Leaves the k-th key in sh.prefix, in
// sh.k_rem how many anchors with exactly that key are taken (the first ones by index) and in sh.eq how many there
// are.
template <typename ForEachKey>
__device__ void radix_select(ForEachKey for_each_key, int64_t implicit, int k, RadixState& sh) {
  if (threadIdx.x == 0) {
    sh.prefix = 0;
    sh.k_rem = k;
    sh.eq = -1;
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
            sh.eq = sh.hist[bin];  // after the last pass: the anchors with exactly the k-th key
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

// Given the k-th key, the number of ties to take and the number of anchors with that key (radix_select's), walks the
// explicit entries in anchor order and calls take(entry) for the chosen ones. Ties at kth rank by anchor index among
// all anchors with that key; for the zero key that includes the implicit anchors. When every anchor with the k-th
// key is taken (k_eq == n_eq: the usual case) no rank is needed, and one pass without barriers takes the keys >= kth.
template <int NT, typename T, typename Src, typename Take>
__device__ void take_in_order(const Src& src, uint32_t kth, int k_eq, int n_eq,
                              typename BlockScanT<NT>::TempStorage& scan_tmp, Take take) {
  static_assert(NT < (1 << 15), "the per-chunk counts are packed in 16 bits");
  const int64_t n = src.size();
  if (k_eq == n_eq) {  // the same in all threads
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      KeyedEntry<T> e;
      if (src.get(i, e) && e.key >= kth) take(e);
    }
    return;
  }
  int before_ne = 0, before_eq = 0;  // running totals over earlier chunks (same in all threads)
  for (int64_t base = 0; base < n; base += blockDim.x) {
    const int64_t i = base + threadIdx.x;
    KeyedEntry<T> e;
    const bool has = i < n && src.get(i, e);
    const int is_eq = has && e.key == kth;
    const int is_ne_zero = has && e.key != kZeroKey;  // explicit entries that are not metric-0 anchors
    // both counts in one scan: at most NT per chunk, so each fits 16 bits
    int ex_both, sum_both;
    BlockScanT<NT>(scan_tmp).ExclusiveSum(is_eq | (is_ne_zero << 16), ex_both, sum_both);
    __syncthreads();
    const int ex_eq = ex_both & 0xFFFF, ex_ne = ex_both >> 16, sum_eq = sum_both & 0xFFFF, sum_ne = sum_both >> 16;
    if (has) {
      bool chosen = e.key > kth;
      if (is_eq) {
        const int64_t rank = kth == kZeroKey ? static_cast<int64_t>(e.anchor) - (before_ne + ex_ne)
                                             : static_cast<int64_t>(before_eq + ex_eq);
        chosen = rank < k_eq;
      }
      if (chosen) take(e);
    }
    before_eq += sum_eq;
    before_ne += sum_ne;
  }
}

// Top-k of a row whose explicit entries come from src (a Source: size() and get(i, entry), in increasing anchor
// order): selects the k best of the A anchors and calls take(entry) for each chosen explicit entry.
template <int NT, typename T, typename Src, typename Take>
__device__ void select_row(const Src& src, int64_t n_explicit, int64_t A, int k, RadixState& sh,
                           typename BlockScanT<NT>::TempStorage& scan_tmp, Take take) {
  radix_select(
      [&](auto f) {
        for (int64_t base = 0; base < src.size(); base += blockDim.x) {
          const int64_t i = base + threadIdx.x;
          KeyedEntry<T> e;
          const bool has = i < src.size() && src.get(i, e);
          f(has, has ? e.key : 0u);
        }
      },
      A - n_explicit, k, sh);
  take_in_order<NT, T>(src, sh.prefix, sh.k_rem, sh.eq, scan_tmp, take);
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
__device__ inline void sort_indices(int32_t* v, int n) {
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

constexpr int kWarps = kThreads / 32;

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

}  // namespace gpu
}  // namespace lucid
