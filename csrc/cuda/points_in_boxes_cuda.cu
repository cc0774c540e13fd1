// Containment pass (SPEC step 1) on the GPU. Each block takes a run of anchors of one (image, object) row; its first
// thread builds the row's candidate region (side floor, corners, edge vectors) into shared memory, then every thread
// tests its anchors against it. cos/sin come from CUDA's math library, as in the reference's torch.cos on the GPU.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <limits>

#include "checks.h"
#include "geometry.h"

namespace lucid {
namespace {

constexpr int kThreads = 256;

template <typename T, bool kRotated>
__global__ void points_in_boxes_kernel(const T* __restrict__ anc, const T* __restrict__ boxes,
                                       const bool* __restrict__ valid, int64_t num_anchors, int64_t blocks_per_row,
                                       T stride_val, bool* __restrict__ out) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) / blocks_per_row;
  const int64_t a = (static_cast<int64_t>(blockIdx.x) % blocks_per_row) * kThreads + threadIdx.x;
  __shared__ geom::HbbRegion<T> hbb;
  __shared__ geom::ObbRegion<T> obb;
  if (threadIdx.x == 0) {
    const T* b = boxes + row * (kRotated ? 5 : 4);
    if (kRotated) {
      obb = geom::obb_candidate_region<T>(b[0], b[1], b[2], b[3], ::cos(b[4]), ::sin(b[4]), valid[row], stride_val);
    } else {
      hbb = geom::hbb_candidate_region<T>(b[0], b[1], b[2], b[3], valid[row], stride_val);
    }
  }
  __syncthreads();
  if (a >= num_anchors) return;
  const T px = anc[2 * a], py = anc[2 * a + 1];
  out[row * num_anchors + a] = kRotated ? geom::obb_contains(obb, px, py) : geom::hbb_contains(hbb, px, py);
}

at::Tensor points_in_boxes_cuda(const at::Tensor& anc_points, const at::Tensor& gt_bboxes, const at::Tensor& mask_gt,
                                double stride_val) {
  const int64_t box_dim = check_points_in_boxes_args(anc_points, gt_bboxes, mask_gt, stride_val);
  const c10::cuda::CUDAGuard guard(gt_bboxes.device());
  const int64_t B = gt_bboxes.size(0), M = gt_bboxes.size(1), A = anc_points.size(0);
  auto out = at::empty({B, M, A}, gt_bboxes.options().dtype(at::kBool));
  if (out.numel() == 0) return out;
  const auto anc = anc_points.contiguous();
  const auto boxes = gt_bboxes.contiguous();
  const auto valid = mask_gt.reshape({B, M}).ne(0).contiguous();
  const int64_t blocks_per_row = (A + kThreads - 1) / kThreads;
  const int64_t blocks = B * M * blocks_per_row;
  TORCH_CHECK(blocks <= std::numeric_limits<int32_t>::max(), "points_in_boxes: B*M*A = ", B, "*", M, "*", A,
              " is too large for one launch");
  const auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES(boxes.scalar_type(), "points_in_boxes_cuda", [&] {
    const auto sv = static_cast<scalar_t>(stride_val);
    if (box_dim == 5) {
      points_in_boxes_kernel<scalar_t, true><<<blocks, kThreads, 0, stream>>>(
          anc.data_ptr<scalar_t>(), boxes.data_ptr<scalar_t>(), valid.data_ptr<bool>(), A, blocks_per_row, sv,
          out.data_ptr<bool>());
    } else {
      points_in_boxes_kernel<scalar_t, false><<<blocks, kThreads, 0, stream>>>(
          anc.data_ptr<scalar_t>(), boxes.data_ptr<scalar_t>(), valid.data_ptr<bool>(), A, blocks_per_row, sv,
          out.data_ptr<bool>());
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(lucid, CUDA, m) { m.impl("points_in_boxes", &points_in_boxes_cuda); }

}  // namespace lucid
