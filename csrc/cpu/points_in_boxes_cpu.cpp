// Containment pass (SPEC step 1) on the CPU: one task per (image, object) row, scanning all anchors.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "checks.h"
#include "geometry.h"

namespace lucid {
namespace {

template <typename T>
void points_in_boxes_rows(const T* anc, const T* boxes, const T* cos_t, const T* sin_t, const bool* valid,
                          int64_t rows, int64_t num_anchors, int64_t box_dim, T stride_val, bool* out) {
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, num_anchors));
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* b = boxes + r * box_dim;
      bool* o = out + r * num_anchors;
      if (box_dim == 4) {
        const auto region = geom::hbb_candidate_region<T>(b[0], b[1], b[2], b[3], valid[r], stride_val);
        for (int64_t a = 0; a < num_anchors; ++a) o[a] = geom::hbb_contains(region, anc[2 * a], anc[2 * a + 1]);
      } else {
        const auto region =
            geom::obb_candidate_region<T>(b[0], b[1], b[2], b[3], cos_t[r], sin_t[r], valid[r], stride_val);
        for (int64_t a = 0; a < num_anchors; ++a) o[a] = geom::obb_contains(region, anc[2 * a], anc[2 * a + 1]);
      }
    }
  });
}

at::Tensor points_in_boxes_cpu(const at::Tensor& anc_points, const at::Tensor& gt_bboxes, const at::Tensor& mask_gt,
                               double stride_val) {
  const int64_t box_dim = check_points_in_boxes_args(anc_points, gt_bboxes, mask_gt, stride_val);
  const int64_t B = gt_bboxes.size(0), M = gt_bboxes.size(1), A = anc_points.size(0);
  auto out = at::empty({B, M, A}, gt_bboxes.options().dtype(at::kBool));
  if (out.numel() == 0) return out;
  const auto anc = anc_points.contiguous();
  const auto boxes = gt_bboxes.contiguous();
  const auto valid = mask_gt.reshape({B, M}).ne(0).contiguous();
  // cos/sin from ATen, the library the reference uses on this device (see geometry.h).
  at::Tensor cos_t, sin_t;
  if (box_dim == 5) {
    const auto angle = boxes.select(2, 4);
    cos_t = angle.cos().contiguous();
    sin_t = angle.sin().contiguous();
  }
  AT_DISPATCH_FLOATING_TYPES(boxes.scalar_type(), "points_in_boxes_cpu", [&] {
    points_in_boxes_rows<scalar_t>(anc.data_ptr<scalar_t>(), boxes.data_ptr<scalar_t>(),
                                   box_dim == 5 ? cos_t.data_ptr<scalar_t>() : nullptr,
                                   box_dim == 5 ? sin_t.data_ptr<scalar_t>() : nullptr, valid.data_ptr<bool>(), B * M,
                                   A, box_dim, static_cast<scalar_t>(stride_val), out.data_ptr<bool>());
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(lucid, CPU, m) { m.impl("points_in_boxes", &points_in_boxes_cpu); }

}  // namespace lucid
