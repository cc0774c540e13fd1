// The decode of the predicted masks for the segmentation assignment (docs/spec.md, "Segmentation"), the part both
// backends share. Which pixels of a predicted mask are set is the sign of a matrix product, and a product's rounding
// depends on the library routine and on the shapes it is called with, which a kernel cannot reproduce. So the
// decode calls the same routine (at::bmm, which the reference's `@` reaches for these 3-d operands: at::matmul
// expands and reshapes each to itself, then calls it) on operands of the same shapes, strides and dtypes as the
// reference builds: each image's chosen anchors in increasing order in slots of one (B, n0, nm) buffer
// of pd_coef's dtype (zeros past an image's count), the images in the order of argsort(descending) of their counts
// (n0 the largest count), and one product coef[chunk, :n] @ proto[images].flatten(2) per chunk of images, n the
// chunk's largest count. A backend supplies how the prototypes are gathered (gather), how the buffer is filled (pack)
// and what is counted in each chunk's product (count); the decoded chunk is the only buffer of (pairs x mask pixels)
// size, about kChunkPixels values (one image's at least).
//
// The counts per image must be known on the host to call the routine with those shapes: the backend copies them there
// before the decode, the assignment's one synchronisation with the device (the reference, and the peer, synchronise
// there too).
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <numeric>
#include <optional>
#include <utility>
#include <vector>

#include "amp.h"
#include "assign_io.h"

namespace lucid {

constexpr int64_t kChunkPixels = int64_t{1} << 27;  // reference.SEG_CHUNK_PIXELS
constexpr int64_t kSegTopkFactor = 3;               // reference.SEG_TOPK_FACTOR

// The dtype an operand takes in the product: as autocast casts it for matmul (amp.h), floating tensors other than
// float64 to the dtype of the call's autocast region (none: unchanged).
inline at::ScalarType operand_dtype(const at::Tensor& t, const AutocastDtype& dtype) {
  if (!dtype || !t.is_floating_point() || t.scalar_type() == at::kDouble) return t.scalar_type();
  return *dtype;
}

// An operand cast to operand_dtype.
inline at::Tensor autocast_operand(const at::Tensor& t, const AutocastDtype& dtype) {
  const auto to = operand_dtype(t, dtype);
  return t.scalar_type() == to ? t : t.to(to);
}

// proto[images].flatten(2) as the reference's `[]` computes it (at::index); for contiguous prototypes index_select
// gives the same contiguous tensor with less host work.
inline at::Tensor gather_images(const at::Tensor& proto, const at::Tensor& images) {
  if (proto.is_contiguous()) return proto.index_select(0, images).flatten(2);
  c10::List<std::optional<at::Tensor>> index;
  index.push_back(images);
  return at::index(proto, index).flatten(2);
}

// Where an allocation starts: a multiple of this many bytes (the CUDA caching allocator's block size, a multiple of
// the CPU allocator's alignment).
constexpr int64_t kAllocationAlignment = 512;

// The images by decreasing count with ties in increasing index (the order a stable sort gives), from the counts on
// the host: the CPU backend's `stable` argument of decode_chosen_masks (the CUDA backend computes it on the device).
inline at::Tensor stable_order_by_count(const int64_t* counts, int64_t B) {
  auto order = at::empty({B}, at::kLong);
  int64_t* images = order.data_ptr<int64_t>();
  std::iota(images, images + B, int64_t{0});
  std::stable_sort(images, images + B, [counts](int64_t i, int64_t j) { return counts[i] > counts[j]; });
  return order;
}

// counts: the chosen anchors of each of the B images, on the host. stable: the images by decreasing count with ties in
// increasing index (on the device of the inputs). The decode's order is argsort(counts, descending) on that device,
// and it reaches the results only through which images each chunk holds: one batched product computes each of its
// images alike (the same routine and shapes for all, an image's values from its own operands alone), whatever the
// image's place in the chunk. Every order by decreasing count gives each chunk the same images unless equal positive
// counts meet where a chunk ends and the next begins; then argsorted(), that call itself (its order among equal
// counts is its own), else `stable` (the places of images without chosen anchors do not matter: they are never
// read).
// gather(images) returns proto[images].flatten(2) as gather_images does (contiguous, proto's dtype). pack(coef, order)
// fills coef (B, n0, nm) (uninitialised): row (p, s) is pd_coef[b, a] for the s-th chosen anchor a of image
// b = order[p] (s < n_b), and zeros past the image's count. count(decoded, start, stop, order) takes the product of
// the images at positions [start, stop) of the order: decoded[p - start, slot, pixel], of shape
// (stop - start, n, mh * mw).
//
// The prototypes of all images are gathered in the order at once when each chunk's slice of them starts where a
// tensor of its own would (a multiple of kAllocationAlignment bytes: a library routine may choose its method by the
// operands' alignment, so the slice must not differ from the reference's operand there); else chunk by chunk, as
// the reference does. A chunk of all B images takes the whole buffers (the same operands as their full slices).
template <typename Argsorted, typename Gather, typename Pack, typename Count>
void decode_chosen_masks(const SegArgs& seg, int64_t B, const int64_t* counts, const at::Tensor& stable,
                         Argsorted argsorted, Gather gather, Pack pack, Count count) {
  if (B == 0) return;
  const int64_t nm = seg.pd_coef.size(2), pixels = seg.proto.size(2) * seg.proto.size(3);
  std::vector<int64_t> n_of(counts, counts + B);  // the counts by position
  std::sort(n_of.begin(), n_of.end(), std::greater<int64_t>());
  if (n_of[0] == 0) return;
  // the chunks of positions (they depend on the sorted counts alone), and whether equal counts meet where one chunk
  // ends and the next begins: only then does the order among equal counts decide which images share a chunk
  std::vector<std::pair<int64_t, int64_t>> chunks;  // [start, stop)
  bool split_ties = false;
  for (int64_t start = 0; start < B && n_of[start] > 0;) {
    const int64_t stop = std::min(B, start + std::max<int64_t>(1, kChunkPixels / (n_of[start] * pixels)));
    chunks.emplace_back(start, stop);
    split_ties = split_ties || (stop < B && n_of[stop] > 0 && n_of[stop] == n_of[stop - 1]);
    start = stop;
  }
  const at::Tensor order = split_ties ? argsorted() : stable;
  const int64_t element = c10::elementSize(operand_dtype(seg.proto, seg.matmul_dtype));
  const bool whole = nm * pixels * element % kAllocationAlignment == 0;
  const auto ordered = whole ? autocast_operand(gather(order), seg.matmul_dtype) : at::Tensor();
  auto coef = at::empty({B, n_of[0], nm}, seg.pd_coef.options());
  pack(coef, order);
  for (const auto& [start, stop] : chunks) {
    const int64_t n = n_of[start];
    const bool all = start == 0 && stop == B;  // then n is n0
    const auto lhs = autocast_operand(all ? coef : coef.slice(0, start, stop).slice(1, 0, n), seg.matmul_dtype);
    const auto rhs = whole ? (all ? ordered : ordered.slice(0, start, stop))
                           : autocast_operand(gather(all ? order : order.slice(0, start, stop)), seg.matmul_dtype);
    count(at::bmm(lhs, rhs), start, stop, order);
  }
}

}  // namespace lucid
