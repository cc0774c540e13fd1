// The anchor index of the fused assignment on the GPU: the anchors bucketed by a grid of cells, built once per call
// (build_anchor_index, by one block of prepare_kernel), so that a row visits only the anchors of the cells under its
// candidate region (walk_cells) instead of all A.
#pragma once

#include <ATen/core/ScalarType.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <cub/block/block_scan.cuh>

#include <cstdint>

#include "cuda/containment.cuh"

namespace lucid {
namespace gpu {

// Anchors are bucketed into a kCells x kCells grid over their bounding box, so that a row visits only the anchors of
// the cells its candidate region's bounding box touches. The candidate set does not depend on the bucketing (the
// exact containment test decides; the box is widened by a margin), and the selection ranks candidates by anchor
// index wherever they tie, so the result is the same as a scan of all anchors in order.
constexpr int kCells = 64;
constexpr int kPrepThreads = 1024;

// One axis of the grid: cell = (v - lo) * scale, clamped to [0, kCells). Multiplying by a fixed positive scale is
// monotonic, as the containment region's bounding box needs (its cells hold every anchor between its corners).
struct Axis {
  float lo;
  float scale;  // NaN: the index cannot be used (an infinite or NaN span)
};

__device__ __forceinline__ Axis make_axis(float lo, float hi) {
  if (!(hi - lo < INFINITY)) return {lo, NAN};
  const float span = hi - lo;
  return {lo, span > 0.0f ? kCells / span : 0.0f};
}

// Cell of a point along one axis; -1 when the index cannot be used.
__device__ __forceinline__ int cell_of(float v, Axis ax) {
  if (ax.scale != ax.scale) return -1;
  const float f = (v - ax.lo) * ax.scale;
  if (!(f >= 0.0f)) return 0;  // also NaN
  return f >= kCells ? kCells - 1 : static_cast<int>(f);
}

struct CellIndex {
  const Axis* axes;        // x, y
  const int32_t* offsets;  // (kCells^2 + 1) start of each cell in `sorted`
  const int32_t* sorted;   // (A) anchors grouped by cell
};

// The anchors as given: float32, or float16/bfloat16 (the peer's, under autocast), which widen to float32 exactly.
struct AnchorsIn {
  const void* p;
  at::ScalarType type;
  __device__ float2 load(int32_t a) const {
    if (type == at::kHalf) {
      const auto* h = static_cast<const c10::Half*>(p);
      return make_float2(static_cast<float>(h[2 * a]), static_cast<float>(h[2 * a + 1]));
    }
    if (type == at::kBFloat16) {
      const auto* h = static_cast<const c10::BFloat16*>(p);
      return make_float2(static_cast<float>(h[2 * a]), static_cast<float>(h[2 * a + 1]));
    }
    const auto* f = static_cast<const float*>(p);
    return make_float2(f[2 * a], f[2 * a + 1]);
  }
};

__device__ __forceinline__ float warp_min_f(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fminf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_max_f(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The index, built by one block of kPrepThreads threads while the other blocks of prepare_kernel prepare the boxes. It
// is the longest part of that kernel, so each pass is written for latency: thread t takes anchors t, t + kPrepThreads,
// ... (it reads back only what it wrote itself), and every pass issues the loads of kLoads of them at once:
//   1. the float32 copy of the anchors, and the bounds of the non-NaN ones (NaN anchors never lie inside a box and
//      are left out of the index; an infinite one makes the index unusable: every row then scans all anchors);
//   2. each anchor's cell (kept in `cell_of_anchor`, -1 when left out; the first kHeld of each thread also in
//      registers) and a count per cell in shared memory;
//   3. a block scan of the counts into offsets, and the anchors placed cell by cell (their order within a cell is
//      that of the shared-memory atomics; nothing depends on it): into `stage` (shared memory, stage_cap anchors)
//      and then copied out in order, since scattered stores from one multiprocessor go at about one per cycle.
// Measured on the H200 (2026-11-30), at 21,504 anchors: a version that loaded one anchor at a time in every pass and
// stored the places scattered took ~28 us (12 us at 8,400 anchors), the whole of prepare_kernel's time; with the
// loads batched, 20.6 us, of which Nsight Compute saw this block's multiprocessor busy for 38,000 cycles (~19 us)
// while the others averaged 10,700. A first version with order keys and 64-bit indices kept it busy 50,000 cycles.
constexpr int kHeld = 24;  // cells per thread held in registers: 24,576 anchors in all (1024 px has 21,504)
constexpr int kLoads = 8;  // loads per thread issued at once

__device__ void build_anchor_index(const AnchorsIn& in, int32_t A, float* __restrict__ anc,
                                   int32_t* __restrict__ cell_of_anchor, Axis* axes, int32_t* offsets,
                                   int32_t* __restrict__ sorted, int32_t* stage, int32_t stage_cap) {
  constexpr int kCellCount = kCells * kCells, per = kCellCount / kPrepThreads, kWarpsHere = kPrepThreads / 32;
  __shared__ float part[4][kWarpsHere];  // per warp: min x, min y, max x, max y
  __shared__ Axis ax[2];
  __shared__ int32_t cell[kCellCount];  // counts, then the cursor of each cell
  __shared__ typename cub::BlockScan<int, kPrepThreads>::TempStorage scan_tmp;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  for (int c = tid; c < kCellCount; c += kPrepThreads) cell[c] = 0;
  float lo_x = INFINITY, lo_y = INFINITY, hi_x = -INFINITY, hi_y = -INFINITY;
  for (int32_t a0 = tid; a0 < A; a0 += kLoads * kPrepThreads) {
    float2 p[kLoads];
#pragma unroll
    for (int h = 0; h < kLoads; ++h) {
      const int32_t a = a0 + h * kPrepThreads;
      p[h] = a < A ? in.load(a) : make_float2(NAN, NAN);
    }
#pragma unroll
    for (int h = 0; h < kLoads; ++h) {
      const int32_t a = a0 + h * kPrepThreads;
      if (a < A) reinterpret_cast<float2*>(anc)[a] = p[h];
      if (p[h].x == p[h].x && p[h].y == p[h].y) {
        lo_x = fminf(lo_x, p[h].x);
        lo_y = fminf(lo_y, p[h].y);
        hi_x = fmaxf(hi_x, p[h].x);
        hi_y = fmaxf(hi_y, p[h].y);
      }
    }
  }
  lo_x = warp_min_f(lo_x), lo_y = warp_min_f(lo_y), hi_x = warp_max_f(hi_x), hi_y = warp_max_f(hi_y);
  if (lane == 0) {
    part[0][warp] = lo_x, part[1][warp] = lo_y, part[2][warp] = hi_x, part[3][warp] = hi_y;
  }
  __syncthreads();
  if (tid < 2) {
    float lo = INFINITY, hi = -INFINITY;
    for (int w = 0; w < kWarpsHere; ++w) lo = fminf(lo, part[tid][w]), hi = fmaxf(hi, part[tid + 2][w]);
    // no non-NaN anchor: lo > hi, every cell 0, and the index is empty
    ax[tid] = make_axis(lo, hi);
    axes[tid] = ax[tid];
  }
  __syncthreads();
  const Axis axx = ax[0], axy = ax[1];
  auto cell_at = [&](float2 p) {
    const int cx = cell_of(p.x, axx), cy = cell_of(p.y, axy);
    return p.x == p.x && p.y == p.y && cx >= 0 && cy >= 0 ? cy * kCells + cx : -1;
  };
  int held[kHeld];  // the cells of anchors tid + h * kPrepThreads, h < kHeld
#pragma unroll
  for (int h = 0; h < kHeld; ++h) held[h] = -1;
  for (int32_t a0 = tid; a0 < A; a0 += kHeld * kPrepThreads) {
#pragma unroll
    for (int h0 = 0; h0 < kHeld; h0 += kLoads) {
      float2 p[kLoads];
#pragma unroll
      for (int h = 0; h < kLoads; ++h) {
        const int32_t a = a0 + (h0 + h) * kPrepThreads;
        p[h] = a < A ? reinterpret_cast<const float2*>(anc)[a] : make_float2(NAN, NAN);
      }
#pragma unroll
      for (int h = 0; h < kLoads; ++h) {
        const int32_t a = a0 + (h0 + h) * kPrepThreads;
        const int c = cell_at(p[h]);
        if (a0 == tid) held[h0 + h] = c;
        if (a < A) cell_of_anchor[a] = c;
        if (c >= 0) atomicAdd(&cell[c], 1);
      }
    }
  }
  __syncthreads();
  int local[per];
  int sum = 0;
  for (int j = 0; j < per; ++j) {
    local[j] = cell[tid * per + j];
    sum += local[j];
  }
  int start, total;
  cub::BlockScan<int, kPrepThreads>(scan_tmp).ExclusiveSum(sum, start, total);
  for (int j = 0; j < per; ++j) {
    offsets[tid * per + j] = start;
    cell[tid * per + j] = start;
    start += local[j];
  }
  if (tid == kPrepThreads - 1) offsets[kCellCount] = total;
  __syncthreads();
  // the places are scattered: the first stage_cap go through shared memory and out in order
  auto place = [&](int c, int32_t a) {
    const int pos = atomicAdd(&cell[c], 1);
    if (pos < stage_cap) stage[pos] = a;
    else sorted[pos] = a;
  };
#pragma unroll
  for (int h = 0; h < kHeld; ++h) {
    const int32_t a = tid + h * kPrepThreads;
    if (a < A && held[h] >= 0) place(held[h], a);
  }
  for (int32_t a = tid + kHeld * kPrepThreads; a < A; a += kPrepThreads) {
    const int c = cell_of_anchor[a];
    if (c >= 0) place(c, a);
  }
  __syncthreads();
  const int32_t staged = total < stage_cap ? total : stage_cap;
  for (int32_t i = tid; i < staged; i += kPrepThreads) sorted[i] = stage[i];
}

// The cells under a row's candidate region: columns x0..x1 of rows y0..y1.
struct CellRange {
  int x0, y0, x1, y1;
};

// The cell range under the candidate region of `row`; false when the index cannot be used for it (a non-finite box
// or non-finite anchors): the row must then scan every anchor.
template <typename T>
__device__ bool cells_under(const Regions<T>& regions, int64_t row, int D, const CellIndex& cells, CellRange& r) {
  T x0, y0, x1, y1;
  if (!regions.bbox(row, D, x0, y0, x1, y1)) return false;
  const Axis ax = cells.axes[0], ay = cells.axes[1];
  r.x0 = cell_of(x0, ax), r.x1 = cell_of(x1, ax);
  r.y0 = cell_of(y0, ay), r.y1 = cell_of(y1, ay);
  return r.x0 >= 0 && r.y0 >= 0 && r.x1 >= 0 && r.y1 >= 0;
}

// The number of anchors in the cells of r (all 32 lanes of a warp call it, and all get it).
__device__ __forceinline__ int anchors_under(const CellIndex& cells, const CellRange& r) {
  int n = 0;
  for (int cy = r.y0 + static_cast<int>(threadIdx.x % 32); cy <= r.y1; cy += 32) {
    n += __ldg(&cells.offsets[cy * kCells + r.x1 + 1]) - __ldg(&cells.offsets[cy * kCells + r.x0]);
  }
  for (int o = 16; o > 0; o >>= 1) n += __shfl_xor_sync(0xffffffffu, n, o);
  return n;
}

// Visits the anchors of the cells in r, the 32 lanes of a warp together, 32 anchors at a time: the warp takes the
// cell rows r.y0 + first, r.y0 + first + step, ... and calls visit(a, inside) on every lane for each chunk of 32
// consecutive anchors of a cell row (its columns x0..x1 are contiguous in the index), with inside = test(a) (lanes
// past the end of a cell row get a = 0, inside = false). visit returns false to stop the walk; it must return the
// same in all lanes. A walk is a chain of dependent loads (a cell row's bounds, the anchor's index, its point), so
// their latency sets its time, not the tests: the lanes load the bounds of 32 cell rows at once, and the loads of
// kWalkBatch chunks (of one cell row or several) are issued before any of them is tested.
constexpr int kWalkBatch = 4;

template <typename Test, typename Visit>
__device__ __forceinline__ void walk_cells(const CellIndex& cells, const CellRange& r, int first, int step, Test test,
                                           Visit visit) {
  constexpr unsigned kAll = 0xffffffffu;
  const int lane = threadIdx.x % 32;
  const int n_rows = r.y1 >= r.y0 + first ? (r.y1 - r.y0 - first) / step + 1 : 0;
  for (int g0 = 0; g0 < n_rows; g0 += 32) {
    // lane l holds the range [begin, end) of the group's cell row l
    int begin = 0, end = 0;
    if (g0 + lane < n_rows) {
      const int cy = r.y0 + first + (g0 + lane) * step;
      begin = __ldg(&cells.offsets[cy * kCells + r.x0]);
      end = __ldg(&cells.offsets[cy * kCells + r.x1 + 1]);
    }
    const int rows = n_rows - g0 < 32 ? n_rows - g0 : 32;
    // the cursor (the same in all lanes): cell row `row` of the group, its next chunk at j
    int row = 0, j = __shfl_sync(kAll, begin, 0), row_end = __shfl_sync(kAll, end, 0);
    while (row < rows) {
      int at[kWalkBatch], stop[kWalkBatch];  // chunk u: anchors at[u] .. stop[u] - 1 of the index (<= 32)
#pragma unroll
      for (int u = 0; u < kWalkBatch; ++u) {
        while (row < rows && j >= row_end) {  // the next cell row with anchors left
          ++row;
          j = __shfl_sync(kAll, begin, row & 31);
          row_end = __shfl_sync(kAll, end, row & 31);
        }
        at[u] = j;
        stop[u] = row < rows ? (row_end - j < 32 ? row_end : j + 32) : j;  // empty once the group is done
        j = stop[u];
      }
      int32_t a[kWalkBatch];
      bool inside[kWalkBatch];
#pragma unroll
      for (int u = 0; u < kWalkBatch; ++u) a[u] = at[u] + lane < stop[u] ? __ldg(&cells.sorted[at[u] + lane]) : 0;
#pragma unroll
      for (int u = 0; u < kWalkBatch; ++u) inside[u] = at[u] + lane < stop[u] && test(a[u]);
#pragma unroll
      for (int u = 0; u < kWalkBatch; ++u) {
        if (at[u] >= stop[u]) break;  // the same in all lanes; every later chunk is empty too
        if (!visit(a[u], inside[u])) return;
      }
    }
  }
}

}  // namespace gpu
}  // namespace lucid
