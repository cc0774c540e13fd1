// torch.ops.lucid.detr_cost on the GPU (docs/spec.md, "DETR matching cost"): one thread per (image, query, column),
// detr_cost.h's column cost, in one launch with no host synchronisation. The scores are read in their own
// dtype (widened exactly); the boxes are taken to float32 first, as the peer takes them.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <limits>

#include "checks.h"
#include "cuda/launch.cuh"
#include "detr_cost.h"

namespace lucid {
namespace gpu {
namespace {

constexpr int kMaxGridY = 65535;

// Blocks of (x: query-columns of one image, y: images in turn); each column's cost by detr::column_cost.
template <typename T>
__global__ void detr_cost_kernel(const float* __restrict__ pd, const T* __restrict__ scores,
                                 const float* __restrict__ gt, const int64_t* __restrict__ cls,
                                 const int64_t* __restrict__ sizes, int64_t B, int64_t Q, int64_t C, int64_t N, int64_t W,
                                 detr::CostSettings s, float* __restrict__ out) {
  __shared__ int64_t start, count;
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t b = blockIdx.y; b < B; b += gridDim.y) {
    __syncthreads();  // the previous image's start and count are read by every thread before they change
    if (threadIdx.x == 0) {
      int64_t total = 0;
      for (int64_t k = 0; k < b; ++k) total += sizes[k];
      start = total, count = sizes[b];
    }
    __syncthreads();
    if (e >= Q * W) continue;
    const int64_t q = e / W, j = e - q * W, row = b * Q + q;
    out[row * W + j] = detr::column_cost(scores + row * C, C, pd + row * 4, gt, cls, N, start, count, j, s);
  }
}

at::Tensor detr_cost_cuda(const at::Tensor& pred_bboxes, const at::Tensor& pred_scores, const at::Tensor& gt_bboxes,
                          const at::Tensor& gt_cls, const at::Tensor& sizes, int64_t width, c10::ArrayRef<double> gains,
                          double alpha, double gamma, bool sanitize, int64_t l1_order) {
  const DetrCostDims d =
      check_detr_cost_args(pred_bboxes, pred_scores, gt_bboxes, gt_cls, sizes, width, gains, gamma, l1_order);
  const c10::cuda::CUDAGuard guard(pred_scores.device());
  const auto s = detr::make_settings(gains[0], gains[1], gains[2], alpha, gamma, sanitize, static_cast<int>(l1_order));
  auto out = at::empty({d.B, d.Q, d.W}, pred_scores.options().dtype(at::kFloat));
  if (out.numel() == 0) return out;
  const auto scores = pred_scores.contiguous(), pd = pred_bboxes.to(at::kFloat).contiguous();
  const auto gt = gt_bboxes.to(at::kFloat).contiguous();
  const auto cls = gt_cls.to(at::kLong).contiguous(), n = sizes.to(at::kLong).contiguous();
  const dim3 grid(blocks_for(d.Q * d.W), static_cast<unsigned>(std::min<int64_t>(d.B, kMaxGridY)));
  const auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, scores.scalar_type(), "detr_cost_cuda", [&] {
    detr_cost_kernel<scalar_t><<<grid, kThreads, 0, stream>>>(
        pd.data_ptr<float>(), scores.data_ptr<scalar_t>(), gt.data_ptr<float>(), cls.data_ptr<int64_t>(),
        n.data_ptr<int64_t>(), d.B, d.Q, d.C, d.N, d.W, s, out.data_ptr<float>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(lucid, CUDA, m) { m.impl("detr_cost", &detr_cost_cuda); }

}  // namespace gpu
}  // namespace lucid
