// Segmentation on the GPU (docs/spec.md, "Segmentation"): after the row kernels have chosen each row's pairs for a
// mask IoU (MaskChoicePass), one launch (chosen_rows_kernel) gives the chosen anchors of each image their slots, sorts
// each row's list and counts each such row's mask pixels; the images are ordered by their counts
// (order_by_count_kernel); the decode (mask_decode.h) packs the chosen anchors' coefficients (pack_coef_kernel) and,
// chunk by chunk of its products, count_masks_kernel counts each chosen pair's pixels into its IoU. Integer counts
// only: the results do not depend on the order of threads.
#pragma once

#include <c10/macros/Macros.h>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <cstdint>

#include "cuda/launch.cuh"
#include "cuda/seg_view.cuh"
#include "geometry.h"

namespace lucid {
namespace gpu {

constexpr int kChosenThreads = 1024;
constexpr int kRowsPerSortBlock = kChosenThreads / 32;

// What chosen_rows_kernel reads and writes.
struct ChosenRowsArgs {
  const int32_t* chosen;   // (B*A) whether an image's anchor is chosen by any of its rows
  const int32_t* n;        // (B*M) chosen pairs per row
  const int32_t* anchors;  // (B*M*k3) each row's chosen anchors as taken
  const bool* gt;          // object masks, element (b, m, y, x) at b*g0 + m*g1 + y*g2 + x*g3
  int64_t g0, g1, g2, g3;
  int64_t B, A, M;
  int k3, mh, mw;
  int32_t* slot;           // (B*A) an anchor's slot among its image's chosen anchors
  int32_t* anchor_of;      // (B*A) the anchor of each slot of an image
  int64_t* per_image;      // (B) chosen anchors per image
  int32_t* sorted;         // (B*M*k3) each row's chosen anchors, increasing
  int64_t* gt_count;       // (B*M) the pixels of each object's mask (rows with chosen pairs)
};

inline int64_t chosen_rows_blocks(int64_t B, int64_t M) {
  return B + (B * M + kRowsPerSortBlock - 1) / kRowsPerSortBlock + B * M;
}

// Three jobs in one launch, by block: blocks [0, B) give each chosen anchor of image b its slot among the image's
// chosen anchors (increasing), the anchor of each slot and their count; the next blocks sort the chosen anchors of
// kRowsPerSortBlock rows each (a warp per row, each anchor placed by the count of smaller ones: they are distinct);
// the last B*M count each row's mask pixels (a row of contiguous pixels at a 16-byte boundary is read 16 bool bytes,
// 0 or 1 each, at a time).
__global__ void __launch_bounds__(kChosenThreads) chosen_rows_kernel(ChosenRowsArgs c) {
  using Scan = cub::BlockScan<int, kChosenThreads>;
  using Reduce = cub::BlockReduce<int, kChosenThreads>;
  __shared__ union {
    typename Scan::TempStorage scan;
    typename Reduce::TempStorage reduce;
  } tmp;
  const int64_t block = blockIdx.x, sort_blocks = (c.B * c.M + kRowsPerSortBlock - 1) / kRowsPerSortBlock;
  if (block < c.B) {
    const int64_t b = block;
    int base = 0;
    for (int64_t a0 = 0; a0 < c.A; a0 += kChosenThreads) {
      const int64_t a = a0 + threadIdx.x;
      const int on = a < c.A && c.chosen[b * c.A + a];
      int offset, total;
      Scan(tmp.scan).ExclusiveSum(on, offset, total);
      __syncthreads();
      if (on) {
        c.slot[b * c.A + a] = base + offset;
        c.anchor_of[b * c.A + base + offset] = static_cast<int32_t>(a);
      }
      base += total;
    }
    if (threadIdx.x == 0) c.per_image[b] = base;
  } else if (block < c.B + sort_blocks) {
    const int64_t row = (block - c.B) * kRowsPerSortBlock + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= c.B * c.M) return;
    const int32_t* in = c.anchors + row * c.k3;
    const int count = c.n[row];
    for (int i = lane; i < count; i += 32) {
      const int32_t a = in[i];
      int before = 0;
      for (int j = 0; j < count; ++j) before += in[j] < a;
      c.sorted[row * c.k3 + before] = a;
    }
  } else {
    const int64_t row = block - c.B - sort_blocks;
    if (c.n[row] == 0) return;  // the same in the whole block
    const bool* g = c.gt + (row / c.M) * c.g0 + (row % c.M) * c.g1;
    const int pixels = c.mh * c.mw;
    int mine = 0;
    if (c.g3 == 1 && c.g2 == c.mw && pixels % 16 == 0 && reinterpret_cast<uintptr_t>(g) % 16 == 0) {
      const uint4* v = reinterpret_cast<const uint4*>(g);
      for (int i = threadIdx.x; i < pixels / 16; i += kChosenThreads) {
        const uint4 w = v[i];
        mine += __popc(w.x) + __popc(w.y) + __popc(w.z) + __popc(w.w);
      }
    } else {
      for (int i = threadIdx.x; i < pixels; i += kChosenThreads) mine += g[(i / c.mw) * c.g2 + (i % c.mw) * c.g3];
    }
    const int total = Reduce(tmp.reduce).Sum(mine);
    if (threadIdx.x == 0) c.gt_count[row] = total;
  }
}

// A thread per image: its place among the images by decreasing count with ties in increasing index (a stable
// sort), order[place] = image (mask_decode.h's `stable`).
__global__ void __launch_bounds__(kThreads)
    order_by_count_kernel(const int64_t* per_image, int64_t B, int64_t* order) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (b >= B) return;
  const int64_t mine = per_image[b];
  int64_t place = 0;
  for (int64_t j = 0; j < B; ++j) {
    const int64_t other = per_image[j];
    place += other > mine || (other == mine && j < b);
  }
  order[place] = b;
}

// A thread per value of coef (B, n0, nm), contiguous: row (p, s) holds pd_coef[b, a, :] (any strides) for the s-th
// chosen anchor a of image b = order[p], copied as it is, or zeros past the image's count.
template <typename E>
__global__ void __launch_bounds__(kThreads)
    pack_coef_kernel(const E* pd_coef, int64_t s0, int64_t s1, int64_t s2, const int32_t* anchor_of,
                     const int64_t* per_image, const int64_t* order, int64_t B, int64_t A, int64_t n0, int64_t nm,
                     E* coef) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= B * n0 * nm) return;
  const int64_t c = i % nm, s = (i / nm) % n0, b = order[i / (nm * n0)];
  coef[i] = s < per_image[b] ? pd_coef[b * s0 + anchor_of[b * A + s] * s1 + c * s2] : E(0);
}

// A decoded value's pixel is set when it is > 0 (in its own dtype: widening is exact).
template <typename E>
__device__ __forceinline__ bool positive(E v) {
  return static_cast<float>(v) > 0.0f;
}
__device__ __forceinline__ bool positive(double v) { return v > 0.0; }

// What count_masks_kernel reads besides the decoded chunk.
struct MaskCountArgs {
  const int32_t* n;        // (B*M) chosen pairs per row
  const int32_t* sorted;   // (B*M*k3)
  const int32_t* slot;     // (B*A)
  const float* pd;         // (B*A, 4) predicted boxes
  const void* scale;       // (B) with stride scale_stride: box units to mask pixels
  int64_t scale_stride;
  bool scale_double;
  const bool* gt;          // gt_masks != 0, element (b, m, y, x) at b*g0 + m*g1 + y*g2 + x*g3
  int64_t g0, g1, g2, g3;
  const int64_t* gt_count; // (B*M) pixels of each object's mask (rows with chosen pairs)
  float* iou;              // (B*M*k3)
  int64_t A, M;
  int k3;
  int mh, mw;
};

// A block per pair slot (row, j) of the images at positions [start, stop) of the decode's order (order: the images
// by position): a chosen pair's predicted mask (decoded > 0, element (p - start, slot, pixel) of a
// (stop - start, n, mh * mw) chunk) within its box's crop, against the object's mask. The threads take the crop's
// pixels in turn, row by row, kCountUnroll at a time (their loads independent, so that they overlap). Both counts
// are summed in one 64-bit value (each below 2^24).
constexpr int kCountThreads = 128;
constexpr int kCountUnroll = 4;

template <typename E>
__global__ void __launch_bounds__(kCountThreads)
    count_masks_kernel(const E* decoded, int64_t n, int64_t start, const int64_t* order, MaskCountArgs c) {
  using Reduce = cub::BlockReduce<unsigned long long, kCountThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  const int64_t per_image = c.M * c.k3;
  const int64_t p = start + blockIdx.x / per_image, r = blockIdx.x % per_image;
  const int64_t b = order[p], row = b * c.M + r / c.k3, j = r % c.k3;
  if (j >= c.n[row]) return;  // the same in the whole block
  const int64_t w = row * c.k3 + j;
  const int64_t a = c.sorted[w];
  const float* box = c.pd + (b * c.A + a) * 4;
  auto scaled = [&](float v) {
    if (c.scale_double) {
      return static_cast<float>(__dmul_rn(v, static_cast<const double*>(c.scale)[b * c.scale_stride]));
    }
    return __fmul_rn(v, static_cast<const float*>(c.scale)[b * c.scale_stride]);
  };
  const geom::PixelRange xs = geom::crop_range(scaled(box[0]), scaled(box[2]), c.mw);
  const geom::PixelRange ys = geom::crop_range(scaled(box[1]), scaled(box[3]), c.mh);
  const E* pm = decoded + ((p - start) * n + c.slot[b * c.A + a]) * static_cast<int64_t>(c.mh) * c.mw;
  const bool* g = c.gt + b * c.g0 + (row % c.M) * c.g1;
  const int width = xs.end - xs.first, height = ys.end - ys.first;
  unsigned long long mine = 0;  // the intersection in the high half, the predicted pixels in the low half
  if (width > 0) {
    // this thread's pixels: crop indices t, t + kCountThreads, ... as (row, column), stepped without a division
    const int step_y = kCountThreads / width, step_x = kCountThreads % width;
    int y = threadIdx.x / width, x = threadIdx.x % width;
    while (y < height) {
      int at_y[kCountUnroll], at_x[kCountUnroll];
#pragma unroll
      for (int k = 0; k < kCountUnroll; ++k) {
        at_y[k] = y;
        at_x[k] = x;
        y += step_y;
        x += step_x;
        if (x >= width) {
          x -= width;
          ++y;
        }
      }
#pragma unroll
      for (int k = 0; k < kCountUnroll; ++k) {
        if (at_y[k] < height) {
          const int yy = ys.first + at_y[k], xx = xs.first + at_x[k];
          const bool on = positive(pm[yy * c.mw + xx]);
          const bool in = g[yy * c.g2 + xx * c.g3];
          mine += on ? (in ? (1ull << 32) + 1 : 1ull) : 0ull;
        }
      }
    }
  }
  const unsigned long long total = Reduce(tmp).Sum(mine);
  if (threadIdx.x == 0) {
    c.iou[w] = geom::mask_iou(static_cast<int64_t>(total >> 32), c.gt_count[row],
                              static_cast<int64_t>(total & 0xFFFFFFFFull));
  }
}

// A thread per 16 bytes of out, (count, ...) contiguous: image p of out is image images[p] of in (contiguous, each
// image `units` 16-byte units).
__global__ void __launch_bounds__(kThreads)
    gather_images_kernel(const uint4* in, const int64_t* images, int64_t count, int64_t units, uint4* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= count * units) return;
  out[i] = in[images[i / units] * units + i % units];
}

}  // namespace gpu
}  // namespace lucid
