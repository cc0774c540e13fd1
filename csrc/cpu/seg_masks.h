// Segmentation on the CPU (docs/spec.md, "Segmentation"): step 2's overlap of a candidate pair is the mean of its box
// overlap and a mask IoU, which is 0 except for each object's min(3K, A) best pairs by box metric. SegRows chooses
// those pairs (the top-k of row_select.h over `s^alpha * o^beta + eps`), decodes the chosen anchors' masks
// (mask_decode.h: ATen's batched product in the reference's shapes) and counts each chosen pair's pixels; the
// assignment then reads the IoUs through OverlapBatch. Memory: O(B*M*3K + B*A), the decoded chunk, and a bool copy of
// gt_masks when it is not bool.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "assign_io.h"
#include "geometry.h"
#include "mask_decode.h"

namespace lucid {
namespace cpu {

template <typename T>
struct SegRows {
  int64_t M = 0, A = 0, K3 = 0;
  std::vector<int64_t> n;        // (B*M) the chosen pairs of each row
  std::vector<int64_t> anchors;  // (B*M*K3) each row's chosen anchors, increasing
  std::vector<T> iou;            // (B*M*K3) their mask IoUs

  // The mask IoU of pair (row, anchor a): that of a chosen pair, else 0.
  T mask_iou(int64_t row, int64_t a) const {
    const int64_t* first = anchors.data() + row * K3;
    const int64_t* last = first + n[row];
    const int64_t* it = std::lower_bound(first, last, a);
    return it != last && *it == a ? iou[it - anchors.data()] : T(0);
  }
};

// Fills seg.iou for the chosen pairs (seg.n, seg.anchors): the decode of mask_decode.h, then per pair its pixel counts.
// pd: (B, A, 4) contiguous predicted boxes.
template <typename T>
void count_mask_ious(SegRows<T>& rows, const SegArgs& seg, const T* pd, int64_t B) {
  const int64_t M = rows.M, A = rows.A, K3 = rows.K3;
  const int64_t mh = seg.proto.size(2), mw = seg.proto.size(3), pixels = mh * mw;
  // each image's chosen anchors in increasing order: their slots
  std::vector<int64_t> slot(B * A, -1);
  auto per_image = at::zeros({B}, at::kLong);
  int64_t* per = per_image.data_ptr<int64_t>();
  at::parallel_for(0, B, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      int64_t* s = slot.data() + b * A;
      for (int64_t row = b * M; row < (b + 1) * M; ++row) {
        for (int64_t j = 0; j < rows.n[row]; ++j) s[rows.anchors[row * K3 + j]] = 0;
      }
      int64_t next = 0;
      for (int64_t a = 0; a < A; ++a) {
        if (s[a] == 0) s[a] = next++;
      }
      per[b] = next;
    }
  });
  const auto gt = (seg.gt_masks.scalar_type() == at::kBool ? seg.gt_masks.narrow(1, 0, M)
                                                            : seg.gt_masks.narrow(1, 0, M).ne(0))
                      .contiguous();
  const bool* gm = gt.const_data_ptr<bool>();
  std::vector<int64_t> gc(B * M, 0);  // the pixels of each object's mask (rows with chosen pairs)
  at::parallel_for(0, B * M, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t row = r0; row < r1; ++row) {
      if (rows.n[row] == 0) continue;
      gc[row] = std::count(gm + row * pixels, gm + (row + 1) * pixels, true);
    }
  });
  const auto scale = seg.mask_scale.reshape({B}).contiguous();
  auto scaled = [&](int64_t b, T v) -> T {  // box units to mask pixels, as the reference's product rounds it
    if (scale.scalar_type() == at::kDouble) {
      return static_cast<T>(static_cast<double>(v) * scale.const_data_ptr<double>()[b]);
    }
    return static_cast<T>(v * static_cast<T>(scale.const_data_ptr<float>()[b]));
  };
  std::vector<int64_t> place(B);  // each image's position in the decode's order
  auto pack = [&](at::Tensor& coef, const at::Tensor& order) {
    const int64_t* ord = order.const_data_ptr<int64_t>();
    for (int64_t p = 0; p < B; ++p) place[ord[p]] = p;
    const int64_t n0 = coef.size(1), nm = coef.size(2);
    coef.zero_();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, coef.scalar_type(), "seg_pack", [&] {
      scalar_t* out = coef.data_ptr<scalar_t>();
      const scalar_t* in = seg.pd_coef.const_data_ptr<scalar_t>();
      const int64_t s0 = seg.pd_coef.stride(0), s1 = seg.pd_coef.stride(1), s2 = seg.pd_coef.stride(2);
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t a = 0; a < A; ++a) {
          const int64_t s = slot[b * A + a];
          if (s < 0) continue;
          scalar_t* dst = out + (place[b] * n0 + s) * nm;
          for (int64_t c = 0; c < nm; ++c) dst[c] = in[b * s0 + a * s1 + c * s2];
        }
      }
    });
  };
  auto count = [&](const at::Tensor& decoded_in, int64_t start, int64_t stop, const at::Tensor&) {
    const auto decoded = decoded_in.contiguous();
    const int64_t n = decoded.size(1);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, decoded.scalar_type(), "seg_count", [&] {
      const scalar_t* dec = decoded.const_data_ptr<scalar_t>();
      at::parallel_for(0, B * M, 1, [&](int64_t r0, int64_t r1) {
        for (int64_t row = r0; row < r1; ++row) {
          const int64_t b = row / M, p = place[b];
          if (p < start || p >= stop) continue;
          for (int64_t j = 0; j < rows.n[row]; ++j) {
            const int64_t a = rows.anchors[row * K3 + j];
            const T* box = pd + (b * A + a) * 4;
            const auto xs = geom::crop_range(scaled(b, box[0]), scaled(b, box[2]), static_cast<int>(mw));
            const auto ys = geom::crop_range(scaled(b, box[1]), scaled(b, box[3]), static_cast<int>(mh));
            const scalar_t* pm = dec + ((p - start) * n + slot[b * A + a]) * pixels;
            const bool* g = gm + row * pixels;
            int64_t inter = 0, pred = 0;
            for (int y = ys.first; y < ys.end; ++y) {
              for (int x = xs.first; x < xs.end; ++x) {
                const bool on = static_cast<double>(pm[y * mw + x]) > 0.0;
                pred += on;
                inter += on && g[y * mw + x];
              }
            }
            rows.iou[row * K3 + j] = static_cast<T>(geom::mask_iou(inter, gc[row], pred));
          }
        }
      });
    });
  };
  auto gather = [&](const at::Tensor& images) { return gather_images(seg.proto, images); };
  auto argsorted = [&] { return at::argsort(per_image, /*dim=*/-1, /*descending=*/true); };
  decode_chosen_masks(seg, B, per, stable_order_by_count(per, B), argsorted, gather, pack, count);
}

}  // namespace cpu
}  // namespace lucid
