// torch.ops.lucid.points_in_boxes on the GPU (step 1, containment). Each block takes a run of anchors of one (image,
// object) row; its first thread builds the row's candidate region (containment.cuh, as the fused assign does) into
// shared memory, then every thread tests its anchors against it.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <limits>

#include "checks.h"
#include "cuda/containment.cuh"
#include "cuda/launch.cuh"

namespace lucid {
namespace gpu {
namespace {

template <typename T, int D>
__global__ void points_in_boxes_kernel(const T* __restrict__ anc, const T* __restrict__ boxes,
                                       const bool* __restrict__ valid, int64_t num_anchors, int64_t blocks_per_row,
                                       geom::RuleSet<T> rule, bool* __restrict__ out) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) / blocks_per_row;
  const int64_t a = (static_cast<int64_t>(blockIdx.x) % blocks_per_row) * kThreads + threadIdx.x;
  __shared__ geom::HbbRegion<T> hbb;
  __shared__ geom::ObbRegion<T> obb;
  const Regions<T> region{&hbb, &obb};  // one row, index 0
  if (threadIdx.x == 0) {
    const T* b = boxes + row * D;
    region.put(0, b, D, valid[row], rule, D == 5 ? ::cos(b[4]) : T(0), D == 5 ? ::sin(b[4]) : T(0));
  }
  __syncthreads();
  if (a >= num_anchors) return;
  out[row * num_anchors + a] = region.contains(0, D, anc[2 * a], anc[2 * a + 1]);
}

at::Tensor points_in_boxes_cuda(const at::Tensor& anc_points, const at::Tensor& gt_bboxes, const at::Tensor& mask_gt,
                                double stride_val, c10::string_view rules, std::optional<double> first_stride) {
  const int64_t box_dim = check_points_in_boxes_args(anc_points, gt_bboxes, mask_gt, stride_val);
  const auto rule = rule_set(rules, box_dim, stride_val, first_stride);
  const c10::cuda::CUDAGuard guard(gt_bboxes.device());
  const int64_t B = gt_bboxes.size(0), M = gt_bboxes.size(1), A = anc_points.size(0);
  auto out = at::empty({B, M, A}, gt_bboxes.options().dtype(at::kBool));
  if (out.numel() == 0) return out;
  const auto anc = anc_points.contiguous();
  const auto boxes = gt_bboxes.contiguous();
  const auto valid = mask_gt.reshape({B, M}).ne(0).contiguous();
  const int64_t blocks_per_row = (A + kThreads - 1) / kThreads;
  const unsigned blocks = blocks_for(B * M * blocks_per_row, 1);
  const auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES(boxes.scalar_type(), "points_in_boxes_cuda", [&] {
    const auto rule_t = geom::rule_as<scalar_t>(rule);
    auto kernel = box_dim == 5 ? points_in_boxes_kernel<scalar_t, 5> : points_in_boxes_kernel<scalar_t, 4>;
    kernel<<<blocks, kThreads, 0, stream>>>(anc.data_ptr<scalar_t>(), boxes.data_ptr<scalar_t>(),
                                           valid.data_ptr<bool>(), A, blocks_per_row, rule_t, out.data_ptr<bool>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(lucid, CUDA, m) { m.impl("points_in_boxes", &points_in_boxes_cuda); }

}  // namespace gpu
}  // namespace lucid
