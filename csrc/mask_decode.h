// The decode of the predicted masks for the segmentation assignment (docs/spec.md, "Segmentation"), the part both
// backends share. Which pixels of a predicted mask are set is the sign of a matrix product, and a product's rounding
// depends on the library routine and on the shapes it is called with, which a kernel cannot reproduce. So the
// decode calls the same routine (at::matmul, as the reference's `@`) on operands of the same shapes, strides and
// dtypes as the reference builds: each image's chosen anchors in increasing order in slots of one (B, n0, nm) buffer
// of pd_coef's dtype (zeros past an image's count), the images in the order of argsort(descending) of their counts
// (n0 the largest count), and one product coef[chunk, :n] @ proto[images].flatten(2) per chunk of images, n the
// chunk's largest count. A backend supplies how the prototypes are gathered (gather), how the buffer is filled (pack)
// and what is counted in each chunk's product (count); the decoded chunk is the only buffer of (pairs x mask pixels)
// size, about kChunkPixels values (one image's at least).
//
// The counts per image must be known on the host to call the routine with those shapes: this is the assignment's
// one synchronisation with the device (the reference, and the peer, synchronise there too).
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <optional>
#include <utility>
#include <vector>

#include "amp.h"
#include "assign_io.h"

namespace lucid {

constexpr int64_t kChunkPixels = int64_t{1} << 27;  // reference.SEG_CHUNK_PIXELS
constexpr int64_t kSegTopkFactor = 3;               // reference.SEG_TOPK_FACTOR

// An operand as CUDA autocast would cast it for matmul (amp.h): floating tensors other than float64, to the dtype
// of the autocast kernel that forwarded this call (none: unchanged).
inline at::Tensor autocast_operand(const at::Tensor& t) {
  const auto& dtype = autocast_matmul_dtype();
  if (!dtype || !t.is_floating_point() || t.scalar_type() == at::kDouble || t.scalar_type() == *dtype) return t;
  return t.to(*dtype);
}

// The dtype an operand takes in the product (autocast_operand's).
inline at::ScalarType operand_dtype(const at::Tensor& t) {
  const auto& dtype = autocast_matmul_dtype();
  if (!dtype || !t.is_floating_point() || t.scalar_type() == at::kDouble) return t.scalar_type();
  return *dtype;
}

// proto[images] as the reference's `[]` computes it (at::index); for contiguous prototypes index_select gives the same
// contiguous tensor with less host work.
inline at::Tensor gather_images(const at::Tensor& proto, const at::Tensor& images) {
  if (proto.is_contiguous()) return proto.index_select(0, images);
  c10::List<std::optional<at::Tensor>> index;
  index.push_back(images);
  return at::index(proto, index);
}

// Where an allocation starts: a multiple of this many bytes (the CUDA caching allocator's block size, a multiple of
// the CPU allocator's alignment).
constexpr int64_t kAllocationAlignment = 512;

// The images by decreasing count, as at::argsort(per_image, descending) orders them: on the host when no two counts
// are equal (the order is then the only one; one copy to the device instead of a sort there), else that call itself
// (its order among equal counts is its own). Returns the order (on per_image's device) and the counts in that order
// (on the host).
inline std::pair<at::Tensor, std::vector<int64_t>> order_by_count(const at::Tensor& per_image,
                                                                  const at::Tensor& per_image_host) {
  const int64_t B = per_image.size(0);
  const int64_t* n_of = per_image_host.const_data_ptr<int64_t>();
  std::vector<int64_t> images(B);
  std::iota(images.begin(), images.end(), int64_t{0});
  std::stable_sort(images.begin(), images.end(), [n_of](int64_t i, int64_t j) { return n_of[i] > n_of[j]; });
  std::vector<int64_t> counts(B);
  bool ties = false;
  for (int64_t p = 0; p < B; ++p) {
    counts[p] = n_of[images[p]];
    ties = ties || (p > 0 && counts[p] == counts[p - 1]);
  }
  if (ties) return {at::argsort(per_image, /*dim=*/-1, /*descending=*/true), std::move(counts)};
  auto host = at::empty({B}, per_image_host.options().pinned_memory(!per_image.is_cpu()));
  std::copy(images.begin(), images.end(), host.data_ptr<int64_t>());
  return {host.to(per_image.device(), /*non_blocking=*/true), std::move(counts)};
}

// per_image: (B,) int64, the chosen anchors of each image (on the device). gather(images) returns proto[images] as
// gather_images does (contiguous, proto's dtype). pack(coef, order) fills coef (B, n0, nm) (uninitialised): row
// (p, s) is pd_coef[b, a] for the s-th chosen anchor a of image b = order[p] (s < n_b), and zeros past the image's
// count. count(decoded, start, stop, order) takes the product of the images at positions [start, stop) of the order:
// decoded[p - start, slot, pixel], of shape (stop - start, n, mh * mw).
//
// The prototypes of all images are gathered in the order at once when each chunk's slice of them starts where a
// tensor of its own would (a multiple of kAllocationAlignment bytes: a library routine may choose its method by the
// operands' alignment, so the slice must not differ from the reference's operand there); else chunk by chunk, as
// the reference does.
template <typename Gather, typename Pack, typename Count>
void decode_chosen_masks(const SegArgs& seg, const at::Tensor& per_image, Gather gather, Pack pack, Count count) {
  const int64_t B = per_image.size(0);
  if (B == 0) return;
  const int64_t nm = seg.pd_coef.size(2), pixels = seg.proto.size(2) * seg.proto.size(3);
  const auto per_image_host = per_image.to(at::kCPU);  // the synchronisation
  const auto [order, n_of] = order_by_count(per_image, per_image_host);
  if (n_of[0] == 0) return;
  const bool whole = nm * pixels * c10::elementSize(operand_dtype(seg.proto)) % kAllocationAlignment == 0;
  const auto ordered = whole ? autocast_operand(gather(order)).flatten(2) : at::Tensor();
  auto coef = at::empty({B, n_of[0], nm}, seg.pd_coef.options());
  pack(coef, order);
  for (int64_t start = 0; start < B && n_of[start] > 0;) {
    const int64_t n = n_of[start];
    const int64_t stop = std::min(B, start + std::max<int64_t>(1, kChunkPixels / (n * pixels)));
    const auto lhs = autocast_operand(coef.slice(0, start, stop).slice(1, 0, n));
    const auto rhs = whole ? ordered.slice(0, start, stop)
                           : autocast_operand(gather(order.slice(0, start, stop))).flatten(2);
    count(at::matmul(lhs, rhs), start, stop, order);
    start = stop;
  }
}

}  // namespace lucid
