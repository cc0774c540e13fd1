// Segmentation on the GPU (docs/spec.md, "Segmentation"): the row kernels choose each row's pairs for a mask IoU
// (MaskChoicePass, which also counts each image's chosen anchors) and the images are ordered by those counts
// (order_by_count_kernel); once the counts are on their way to the host, one launch (chosen_rows_kernel) gives the
// chosen anchors of each image their slots, sorts each row's list and counts each such row's mask pixels, and another
// (pieces_kernel) gives each chosen pair its crop and cuts the crop into pieces of rows, listed by image; the decode
// (mask_decode.h) packs the chosen anchors' coefficients (pack_coef_kernel) and, chunk by chunk of its products,
// count_masks_kernel counts each piece's pixels into its pair's counts. Integer counts only: the results do not
// depend on the order of threads.
#pragma once

#include <c10/macros/Macros.h>
#include <cub/block/block_scan.cuh>

#include <cstdint>

#include "cuda/launch.cuh"
#include "cuda/seg_view.cuh"
#include "geometry.h"

namespace lucid {
namespace gpu {

constexpr int kChosenThreads = 1024;
constexpr int kRowsPerSortBlock = kChosenThreads / 32;
constexpr int kMaskRowThreads = 128;  // threads counting one object's mask pixels
constexpr int kRowsPerMaskBlock = kChosenThreads / kMaskRowThreads;

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
  int32_t* sorted;         // (B*M*k3) each row's chosen anchors, increasing
  int64_t* gt_count;       // (B*M) the pixels of each object's mask (rows with chosen pairs)
};

inline int64_t chosen_rows_blocks(int64_t B, int64_t M) {
  return B + (B * M + kRowsPerSortBlock - 1) / kRowsPerSortBlock + (B * M + kRowsPerMaskBlock - 1) / kRowsPerMaskBlock;
}

// Three jobs in one launch, by block: blocks [0, B) give each chosen anchor of image b its slot among the image's
// chosen anchors (increasing) and the anchor of each slot (each thread a run of consecutive anchors, one block scan);
// the next blocks sort the chosen anchors of kRowsPerSortBlock rows each (a warp per row, each anchor placed by the
// count of smaller ones: they are distinct); the last count the mask pixels of kRowsPerMaskBlock rows each,
// kMaskRowThreads threads a row (a row of contiguous pixels at a 16-byte boundary is read 16 bool bytes, 0 or 1
// each, at a time, four loads in flight a thread), summed with integer atomics in shared memory.
__global__ void __launch_bounds__(kChosenThreads) chosen_rows_kernel(ChosenRowsArgs c) {
  using Scan = cub::BlockScan<int, kChosenThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ int mask_sums[kRowsPerMaskBlock];
  const int64_t block = blockIdx.x, sort_blocks = (c.B * c.M + kRowsPerSortBlock - 1) / kRowsPerSortBlock;
  if (block < c.B) {
    const int64_t b = block;
    const int32_t* on = c.chosen + b * c.A;
    const int64_t per = (c.A + kChosenThreads - 1) / kChosenThreads;
    const int64_t a0 = threadIdx.x * per, a1 = a0 + per < c.A ? a0 + per : c.A;
    int mine = 0;
#pragma unroll 4
    for (int64_t a = a0; a < a1; ++a) mine += on[a] != 0;
    int slot, total;
    Scan(scan_tmp).ExclusiveSum(mine, slot, total);
    for (int64_t a = a0; a < a1; ++a) {
      if (on[a] != 0) {
        c.slot[b * c.A + a] = slot;
        c.anchor_of[b * c.A + slot] = static_cast<int32_t>(a);
        ++slot;
      }
    }
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
    const int local = threadIdx.x / kMaskRowThreads, t = threadIdx.x % kMaskRowThreads;
    const int64_t row = (block - c.B - sort_blocks) * kRowsPerMaskBlock + local;
    if (threadIdx.x < kRowsPerMaskBlock) mask_sums[threadIdx.x] = 0;
    __syncthreads();
    const bool counted = row < c.B * c.M && c.n[row] > 0;  // the same in the row's warps
    int mine = 0;
    if (counted) {
      const bool* g = c.gt + (row / c.M) * c.g0 + (row % c.M) * c.g1;
      const int pixels = c.mh * c.mw;
      if (c.g3 == 1 && c.g2 == c.mw && pixels % 16 == 0 && reinterpret_cast<uintptr_t>(g) % 16 == 0) {
        const uint4* v = reinterpret_cast<const uint4*>(g);
#pragma unroll 4
        for (int i = t; i < pixels / 16; i += kMaskRowThreads) {
          const uint4 w = v[i];
          mine += __popc(w.x) + __popc(w.y) + __popc(w.z) + __popc(w.w);
        }
      } else {
        for (int i = t; i < pixels; i += kMaskRowThreads) mine += g[(i / c.mw) * c.g2 + (i % c.mw) * c.g3];
      }
      for (int d = 16; d > 0; d >>= 1) mine += __shfl_xor_sync(0xffffffffu, mine, d);
      if (threadIdx.x % 32 == 0) atomicAdd(&mask_sums[local], mine);
    }
    __syncthreads();
    if (t == 0 && counted) c.gt_count[row] = mask_sums[local];
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

// A chosen pair's crop of the mask pixels, [x0, x1) x [y0, y1), its predicted mask's slot among its image's chosen
// anchors, and the crop cut into pieces of `rows` rows (the last one shorter); read through its pieces' entries.
struct alignas(16) PairCrop {
  int32_t slot, x0, x1, y0, y1, rows;
};

// A piece is at least kPiecePixels pixels (a warp's pass over them is a few loads per lane) and a crop at most
// kMaxPieces pieces (an image-sized crop is spread over that many warps).
constexpr int kPiecePixels = 256;
constexpr int kMaxPieces = 8;

// What pieces_kernel reads and writes.
struct PieceArgs {
  const int32_t* n;       // (B*M) chosen pairs per row
  const int32_t* sorted;  // (B*M*k3)
  const int32_t* slot;    // (B*A)
  const float* pd;        // (B*A, 4) predicted boxes
  const void* scale;      // (B) with stride scale_stride: box units to mask pixels
  int64_t scale_stride;
  bool scale_double;
  int64_t A, M;
  int k3, mh, mw;
  PairCrop* crops;        // (B*M*k3)
  int32_t* pieces;        // (B, M*k3*kMaxPieces): entry r * kMaxPieces + q is piece q of pair r = m * k3 + j
  int32_t* piece_n;       // (B)
};

// A block per image: each chosen pair (row, j) of its rows, in order, gets its crop (the predicted box scaled to mask
// pixels) and its pieces, listed one after another (a scan over the pairs).
__global__ void __launch_bounds__(kChosenThreads) pieces_kernel(PieceArgs c) {
  using Scan = cub::BlockScan<int, kChosenThreads>;
  __shared__ typename Scan::TempStorage tmp;
  const int64_t b = blockIdx.x, pairs = c.M * c.k3;
  int32_t* list = c.pieces + b * pairs * kMaxPieces;
  auto scaled = [&](float v) {
    if (c.scale_double) {
      return static_cast<float>(__dmul_rn(v, static_cast<const double*>(c.scale)[b * c.scale_stride]));
    }
    return __fmul_rn(v, static_cast<const float*>(c.scale)[b * c.scale_stride]);
  };
  int base = 0;
  for (int64_t r0 = 0; r0 < pairs; r0 += kChosenThreads) {
    const int64_t r = r0 + threadIdx.x, w = b * pairs + r;
    int mine = 0;
    if (r < pairs && r % c.k3 < c.n[b * c.M + r / c.k3]) {
      const int64_t a = c.sorted[w];
      const float* box = c.pd + (b * c.A + a) * 4;
      const geom::PixelRange xs = geom::crop_range(scaled(box[0]), scaled(box[2]), c.mw);
      const geom::PixelRange ys = geom::crop_range(scaled(box[1]), scaled(box[3]), c.mh);
      const int width = xs.end - xs.first, height = ys.end - ys.first;
      if (width > 0 && height > 0) {  // an empty crop has no pieces
        const int rows = max((kPiecePixels + width - 1) / width, (height + kMaxPieces - 1) / kMaxPieces);
        mine = (height + rows - 1) / rows;
        c.crops[w] = PairCrop{c.slot[b * c.A + a], xs.first, xs.end, ys.first, ys.end, rows};
      }
    }
    int offset, total;
    Scan(tmp).ExclusiveSum(mine, offset, total);
    __syncthreads();  // tmp is taken again
    for (int q = 0; q < mine; ++q) list[base + offset + q] = static_cast<int32_t>(r) * kMaxPieces + q;
    base += total;
  }
  if (threadIdx.x == 0) c.piece_n[b] = base;
}

// A decoded value's pixel is set when it is > 0 (in its own dtype: widening is exact).
template <typename E>
__device__ __forceinline__ bool positive(E v) {
  return static_cast<float>(v) > 0.0f;
}
__device__ __forceinline__ bool positive(double v) { return v > 0.0; }

// What count_masks_kernel reads besides the decoded chunk.
struct MaskCountArgs {
  const int32_t* piece_n;          // (B)
  const int32_t* pieces;           // (B, M*k3*kMaxPieces)
  const PairCrop* crops;           // (B*M*k3)
  const bool* gt;                  // gt_masks != 0, element (b, m, y, x) at b*g0 + m*g1 + y*g2 + x*g3
  int64_t g0, g1, g2, g3;
  unsigned long long* counts;      // (B*M*k3) SegView::counts, from zero
  int64_t M;
  int k3, mh, mw;
};

// The pieces of the images at positions [start, stop) of the decode's order (order: the images by position), a warp
// per piece, the warps taking the pieces in turn (as many as fit on the device): the pixels of a piece of a chosen
// pair's crop in its predicted mask (decoded > 0, element (p - start, slot, pixel) of a (stop - start, n, mh * mw)
// chunk) and in the object's mask, kCountUnroll a lane at a time (their loads independent, so that they overlap),
// added to the pair's counts (an integer atomicAdd of both in one 64-bit value; each below 2^24).
constexpr int kCountUnroll = 8;  // for 16-bit values; 4 for 32-bit, 2 for 64-bit
constexpr int kCountBlocksPerSM = 6;  // 48 warps a multiprocessor (40 registers): the pieces' chains of loads overlap

template <typename E>
__global__ void __launch_bounds__(kThreads, kCountBlocksPerSM)
    count_masks_kernel(const E* decoded, int64_t n, int32_t start, int32_t stop, const int64_t* order,
                       MaskCountArgs c) {
  constexpr unsigned kAll = 0xFFFFFFFFu;
  constexpr int kUnroll = kCountUnroll * 2 / static_cast<int>(sizeof(E) < 2 ? 2 : sizeof(E));  // within 40 registers
  const int lane = threadIdx.x % 32;
  // 32-bit piece indices: B*M*k3*kMaxPieces < 2^31 (checked by the op)
  const int32_t stride = static_cast<int32_t>(gridDim.x) * (kThreads / 32);
  int32_t g = static_cast<int32_t>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;  // this warp's next piece
  const int32_t pairs = static_cast<int32_t>(c.M) * c.k3;
  const int64_t pixels = static_cast<int64_t>(c.mh) * c.mw;
  int32_t before = 0;  // the pieces of the positions before this group of 32
  for (int32_t p0 = start; p0 < stop; p0 += 32) {
    // the positions p0 + lane: their images and pieces, and the pieces up to each (a scan over the lanes)
    const int32_t p = p0 + lane;
    int32_t b = 0, upto = 0;
    if (p < stop) {
      b = static_cast<int32_t>(order[p]);
      upto = c.piece_n[b];
    }
    for (int d = 1; d < 32; d <<= 1) {
      const int32_t v = __shfl_up_sync(kAll, upto, d);
      if (lane >= d) upto += v;
    }
    const int32_t group = __shfl_sync(kAll, upto, 31);
    for (; g < before + group; g += stride) {  // the same in the whole warp
      const int at = __ffs(__ballot_sync(kAll, before + upto > g)) - 1;  // the position of piece g
      const int32_t bb = __shfl_sync(kAll, b, at);
      const int32_t first = at == 0 ? 0 : __shfl_sync(kAll, upto, at - 1);
      const int32_t entry = c.pieces[bb * pairs * kMaxPieces + (g - before - first)];
      const int32_t r = entry / kMaxPieces, w = bb * pairs + r;
      const PairCrop crop = c.crops[w];
      const int width = crop.x1 - crop.x0;
      const int y_first = crop.y0 + (entry % kMaxPieces) * crop.rows;
      const int height = min(crop.y1, y_first + crop.rows) - y_first;
      const E* pm = decoded + (static_cast<int64_t>(p0 + at - start) * n + crop.slot) * pixels;
      const bool* gm = c.gt + bb * c.g0 + (r / c.k3) * c.g1;
      // this lane's pixels: piece indices lane, lane + 32, ... as (row, column), stepped without a division
      const int step_y = 32 / width, step_x = 32 % width;
      int y = lane / width, x = lane % width;
      unsigned inter = 0, pred = 0;
      while (y < height) {
        E value[kUnroll];
        bool in[kUnroll];
#pragma unroll
        for (int k = 0; k < kUnroll; ++k) {  // the loads first
          const int64_t yy = y_first + y, xx = crop.x0 + x;
          const bool live = y < height;
          value[k] = live ? pm[yy * c.mw + xx] : E(0);
          in[k] = live ? gm[yy * c.g2 + xx * c.g3] : false;
          y += step_y;
          x += step_x;
          if (x >= width) {
            x -= width;
            ++y;
          }
        }
#pragma unroll
        for (int k = 0; k < kUnroll; ++k) {
          const bool on = positive(value[k]);
          pred += on;
          inter += on && in[k];
        }
      }
      for (int d = 16; d > 0; d >>= 1) {
        pred += __shfl_xor_sync(kAll, pred, d);
        inter += __shfl_xor_sync(kAll, inter, d);
      }
      if (lane == 0 && pred > 0) atomicAdd(&c.counts[w], (static_cast<unsigned long long>(inter) << 32) | pred);
    }
    before += group;
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
