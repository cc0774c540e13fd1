// Steps 1-3 on the GPU, fused: each real object row visits the anchors of the cells under its candidate region
// (containment), computes the overlap and metric of those inside, and claims its top K over all A anchors with the
// zero fill. Three kernels by the number of candidates a row has; each row's claims are made by exactly one. What a
// row's pairs are ranked by and what becomes of the chosen is the kernels' Pass (problem.cuh): ClaimPass for step 3,
// MaskChoicePass for the segmentation's choice of the pairs that get a mask IoU (the same top-k by another metric),
// UnchosenPass for step 3 of the segmentation's other pairs (merged with the chosen by seg_claims_kernel, below).
#pragma once

#include <c10/macros/Macros.h>

#include <cstdint>

#include "cuda/anchor_index.cuh"
#include "cuda/block_select.cuh"
#include "cuda/problem.cuh"

namespace lucid {
namespace gpu {

// Three kernels by the number of candidates of a row. candidate_topk_small_rows_kernel gives every row a warp:
// padding rows and rows with at most kWarpCap candidates and kWarpWalk anchors under their cells (most rows) are done
// there; the others go to a list of medium rows for candidate_topk_medium_rows_kernel (a block per row, a list of up
// to kListCap entries in shared memory), which passes rows with more candidates on to
// candidate_topk_large_rows_kernel.
constexpr int kWarpCap = 64;  // candidates of a row ranked by one warp (its time grows as their square)
constexpr int kSlots = kWarpCap / 32;
constexpr int kWarpWalk = 512;  // anchors a warp visits for its row at most (the walk's time grows with them)
constexpr int kListCap = 4096;   // candidates of a medium row; more: a large row
constexpr int kBitWords = 2048;  // the medium rows' bitmap of candidates covers up to 65,536 anchors
constexpr int kMediumFewThreads = 1024;  // the medium rows' block when there are few object rows
constexpr int kFewRows = 2;              // ... at most this many per multiprocessor
constexpr int kMediumMidThreads = 512;   // the medium rows' block when there are more, but not many
constexpr int kMidRows = 64;             // ... at most this many per multiprocessor

// A medium row in shared memory: its candidates' (key, anchor) pairs in anchor order, found through a bitmap over the
// A anchors when it fits (A <= kBitWords * 32), else in the order found and then sorted.
struct SharedRow : RadixState {
  uint32_t key[kListCap];
  int32_t anchor[kListCap];
  uint32_t bits[kBitWords];
};

// Source that recomputes the candidates of (row, b) over all A anchors.
template <typename S, typename T, typename Pass>
struct RecomputeSource {
  const Problem<S, T>* P;
  const Pass* pass;
  int64_t row, b;
  __device__ int64_t size() const { return P->A; }
  __device__ bool get(int64_t a, KeyedEntry<T>& e) const {
    if (!P->contains(row, a)) return false;
    e = pass->entry(*P, row, b, a);
    return true;
  }
};

// A warp per row: finds the row's candidates through the cells, and when there are at most kWarpCap ranks them
// (list_ranks) and claims its top K; a row with more, or with more than kWarpWalk anchors to visit, goes to the list
// of medium rows.
template <typename S, typename T, typename Pass>
__global__ void __launch_bounds__(kThreads)
    candidate_topk_small_rows_kernel(Problem<S, T> P, CellIndex cells, Pass pass, int32_t* medium_rows,
                                     int32_t* medium_n) {
  // each warp's row: its candidates' anchors (in the order found) and their metric keys
  __shared__ int32_t s_anchor[kWarps][kWarpCap];
  __shared__ uint32_t s_key[kWarps][kWarpCap];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (row >= P.B * P.M) return;  // whole warps
  if (!P.valid[row]) return;
  // every real row passes here: the device-side check of its label (no host synchronisation)
  CUDA_KERNEL_ASSERT(P.labels[row] >= 0 && P.labels[row] < P.C &&
                     "gt_labels: a real object (mask_gt != 0) has a label outside [0, num_classes)");
  const int64_t b = row / P.M;
  int n = 0;  // candidates found (same in all lanes)
  CellRange range;
  // a row whose cells hold many anchors (a large box, or a long thin one on the diagonal) is walked by a block
  bool fits = cells_under(P.prep.regions, row, P.D, cells, range) && anchors_under(cells, range) <= kWarpWalk;
  if (fits) {
    const RegionOf<T> region = P.prep.regions.of(row, P.D);
    const RowGate gate = P.pose.gate(row);
    walk_cells(
        cells, range, 0, 1, [&](int32_t a) { return region.contains(P.point(a)) && gate.allows(a); },
        [&](int32_t a, bool in) {
          const unsigned m = __ballot_sync(0xffffffffu, in);
          const int slot = n + __popc(m & ((1u << lane) - 1u));
          if (in && slot < kWarpCap) s_anchor[warp][slot] = a;
          n += __popc(m);
          fits = n <= kWarpCap;
          return fits;
        });
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
      const KeyedEntry<T> e = pass.entry(P, row, b, s_anchor[warp][i]);
      pass.record(row, e);
      key[s] = s_key[warp][i] = e.key;
      anchor[s] = e.anchor;
    }
  }
  __syncwarp();
  // each candidate's rank among all A anchors decides whether it is among the K chosen
  int64_t rank[kSlots];
  list_ranks<kSlots>(key, anchor, s_key[warp], s_anchor[warp], n, P.A, rank);
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    if (s * 32 + lane < n && rank[s] < pass.k) pass.take(row, anchor[s], key[s]);
  }
}

// Blocks of NT threads taking medium rows from their list in turn: the same selection from a list of up to kListCap
// candidates in shared memory (radix select, select_row). A row with more candidates goes to the list of large rows.
// NT is kThreads, four blocks to a multiprocessor, when there may be many medium rows (more than kMidRows object rows
// per multiprocessor), where throughput sets the time; with fewer rows the longest row's latency sets it, and larger
// blocks shorten it: kMediumMidThreads (two blocks a multiprocessor) up to kMidRows object rows per multiprocessor,
// kMediumFewThreads up to kFewRows (measured on the H200, docs/design.md).
template <int NT, typename S, typename T, typename Pass>
__global__ void __launch_bounds__(NT, NT == kThreads ? 4 : NT == kMediumMidThreads ? 2 : 1)
    candidate_topk_medium_rows_kernel(Problem<S, T> P, CellIndex cells, Pass pass, const int32_t* medium_rows,
                                      const int32_t* medium_n, int32_t* medium_next, int32_t* big_rows,
                                      int32_t* big_n) {
  __shared__ SharedRow sh;
  __shared__ typename BlockScanT<NT>::TempStorage scan_tmp;
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
    CellRange range;
    if (cells_under(P.prep.regions, row, P.D, cells, range)) {
      // visit the anchors of the cells under the region's bounding box, each warp a cell row in turn (warp-aggregated
      // slots)
      const int lane = threadIdx.x % 32;
      const RegionOf<T> region = P.prep.regions.of(row, P.D);
      const RowGate gate = P.pose.gate(row);
      walk_cells(
          cells, range, threadIdx.x / 32, blockDim.x / 32,
          [&](int32_t a) { return region.contains(P.point(a)) && gate.allows(a); },
          [&](int32_t a, bool in) {
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
            return true;
          });
      __syncthreads();
      count = sh.n;
      if (count > kListCap) {  // a large row: left to candidate_topk_large_rows_kernel, which writes its claims
        if (threadIdx.x == 0) big_rows[atomicAdd(big_n, 1)] = static_cast<int32_t>(row);
        __syncthreads();
        continue;
      }
      if (use_bits) {
        compact_bits<NT>(sh.bits, n_words, scan_tmp, [&](int i, int32_t a) { sh.anchor[i] = a; });
        __syncthreads();
      } else {
        sort_indices(sh.anchor, count);  // ends with a barrier
      }
      // the keys, a few per thread at once so that their loads overlap
      constexpr int kBatch = 2;
      for (int i0 = threadIdx.x; i0 < count; i0 += kBatch * NT) {
        KeyedEntry<T> e[kBatch];
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int i = i0 + u * NT;
          if (i < count) e[u] = pass.entry(P, row, b, sh.anchor[i]);
        }
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int i = i0 + u * NT;
          if (i < count) {
            sh.key[i] = e[u].key;
            pass.record(row, e[u]);
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
        BlockScanT<NT>(scan_tmp).ExclusiveSum(inside, offset, total);
        __syncthreads();
        if (inside) {
          const KeyedEntry<T> e = pass.entry(P, row, b, a);
          pass.record(row, e);
          if (count + offset < kListCap) {
            sh.key[count + offset] = e.key;
            sh.anchor[count + offset] = e.anchor;
          }
        }
        count += total;
      }
      __syncthreads();
    }
    auto take = [&](const KeyedEntry<T>& e) { pass.take(row, e.anchor, e.key); };
    if (count <= kListCap) {
      KeySource<T> src{sh.key, sh.anchor, count};
      select_row<NT, T>(src, count, P.A, pass.k, sh, scan_tmp, take);
    } else {
      RecomputeSource<S, T, Pass> src{&P, &pass, row, b};
      select_row<NT, T>(src, count, P.A, pass.k, sh, scan_tmp, take);
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
// more anchors than that).
constexpr int kBigThreads = 512;

inline int64_t big_row_smem(int64_t A, int64_t cap) { return ((A + 31) / 32) * 4 + cap * 8; }

template <typename S, typename T, typename Pass>
__global__ void __launch_bounds__(kBigThreads, 1)
    candidate_topk_large_rows_kernel(Problem<S, T> P, CellIndex cells, Pass pass, const int32_t* big_rows,
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
    // the candidates, through the cells (the medium-rows kernel found the cell range usable)
    CellRange range;
    cells_under(P.prep.regions, row, P.D, cells, range);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    const RegionOf<T> region = P.prep.regions.of(row, P.D);
    const RowGate gate = P.pose.gate(row);
    auto inside = [&](int32_t a) { return region.contains(P.point(a)) && gate.allows(a); };
    walk_cells(cells, range, warp, warps, inside, [&](int32_t a, bool in) {
      if (in && use_bits) atomicOr(&bits[a >> 5], 1u << (a & 31));
      const unsigned m = __ballot_sync(0xffffffffu, in);
      if (lane == 0 && m) atomicAdd(&sh.n, __popc(m));
      return true;
    });
    __syncthreads();
    const int64_t count = sh.n;
    const int k = pass.k;
    auto take = [&](const KeyedEntry<T>& e) { pass.take(row, e.anchor, e.key); };
    if (use_bits && count <= cap) {
      compact_bits<kBigThreads>(bits, n_words, scan_tmp, [&](int i, int32_t a) { anchors[i] = a; });
      __syncthreads();
      for (int64_t i = threadIdx.x; i < count; i += blockDim.x) {
        const KeyedEntry<T> e = pass.entry(P, row, b, anchors[i]);
        pass.record(row, e);
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
      take_in_order<kBigThreads, T>(src, sh.prefix, sh.k_rem, sh.eq, scan_tmp, take);
    } else {
      // note every candidate once (a walk over the cells), then the in-order walk over all anchors
      walk_cells(cells, range, warp, warps, inside, [&](int32_t a, bool in) {
        if (in) pass.record(row, pass.entry(P, row, b, a));
        return true;
      });
      RecomputeSource<S, T, Pass> src{&P, &pass, row, b};
      select_row<kBigThreads, T>(src, count, P.A, k, sh, scan_tmp, take);
    }
    __syncthreads();  // shared memory is reused by the next row
  }
}

// Segmentation, step 3 after the decode, when a row's chosen pairs and its K best others fit a warp's list
// (k3 + K <= kMergeCap): a warp per real row. The row's top K over all A anchors is the top K of its chosen pairs C
// and of L, the first K of the other anchors (each of the K first of all is in C, or among the first K of the rest).
// L is the row's UnchosenTop (its candidates ranked within the first K of A \ C) and, filling it to min(K, A - |C|),
// the anchors outside the row's region with the lowest indices (the zero fill: key kZeroKey, ranked by index).
// The chosen pairs' entries are computed here with their mask IoUs and go to the PairLog; every candidate ranked
// within the first K of that list (key, then the lower anchor) becomes a claim.
constexpr int kMergeCap = 128;

template <typename S, typename T>
__global__ void __launch_bounds__(kThreads)
    seg_claims_kernel(Problem<S, T> P, PairLog log, Claims claims, UnchosenTop top) {
  __shared__ uint32_t s_key[kWarps][kMergeCap];
  __shared__ int32_t s_anchor[kWarps][kMergeCap];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (row >= P.B * P.M || !P.valid[row]) return;  // whole warps
  const int64_t b = row / P.M;
  const int k = top.k, n_chosen = P.seg.n[row], n_top = top.n[row];
  for (int i = lane; i < n_chosen; i += 32) {
    const int32_t a = P.seg.sorted[row * P.seg.k3 + i];
    const KeyedEntry<T> e = P.entry(row, b, a);
    log.record(row, e);
    s_key[warp][i] = e.key;
    s_anchor[warp][i] = a;
  }
  for (int i = lane; i < n_top; i += 32) {
    s_key[warp][n_chosen + i] = top.key[row * k + i];
    s_anchor[warp][n_chosen + i] = top.anchor[row * k + i];
  }
  int n = n_chosen + n_top;
  // the zero fill: the first anchors outside the region (the same in all lanes)
  int fill = static_cast<int>(min(static_cast<int64_t>(k), P.A - n_chosen)) - n_top;
  for (int64_t base = 0; fill > 0 && base < P.A; base += 32) {
    const int64_t a = base + lane;
    const bool outside = a < P.A && !P.contains(row, a);
    const unsigned m = __ballot_sync(0xffffffffu, outside);
    const int place = __popc(m & ((1u << lane) - 1u));
    if (outside && place < fill) {
      s_key[warp][n + place] = kZeroKey;
      s_anchor[warp][n + place] = static_cast<int32_t>(a);
    }
    const int added = min(__popc(m), fill);
    n += added;
    fill -= added;
  }
  __syncwarp();
  for (int i = lane; i < n_chosen + n_top; i += 32) {
    const uint32_t key = s_key[warp][i];
    const int32_t a = s_anchor[warp][i];
    int rank = 0;
    for (int j = 0; j < n; ++j) {
      const uint32_t kj = s_key[warp][j];
      rank += kj > key || (kj == key && s_anchor[warp][j] < a);
    }
    if (rank < k) claims.put(row, a);
  }
}

}  // namespace gpu
}  // namespace lucid
