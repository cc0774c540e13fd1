// torch.ops.lucid.pair_overlaps on the GPU (step 2): one thread per pair, the overlap from the same per-box values
// as the fused assign (overlap_metric.cuh). float32 boxes.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "checks.h"
#include "cuda/launch.cuh"
#include "cuda/overlap_metric.cuh"

namespace lucid {
namespace gpu {
namespace {

__global__ void pair_overlaps_kernel(const float* gt, const float* pd, int64_t n, int D, float* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = overlap_of(gt + i * D, pd + i * D, D);
}

at::Tensor pair_overlaps_cuda(const at::Tensor& gt_bboxes, const at::Tensor& pd_bboxes) {
  const int64_t D = check_pair_overlaps_args(gt_bboxes, pd_bboxes), n = gt_bboxes.size(0);
  TORCH_CHECK_TYPE(gt_bboxes.scalar_type() == at::kFloat, "on CUDA gt_bboxes and pd_bboxes must be float32, got ",
                   gt_bboxes.scalar_type());
  const c10::cuda::CUDAGuard guard(gt_bboxes.device());
  auto out = at::empty({n}, gt_bboxes.options());
  if (n == 0) return out;
  const auto g = gt_bboxes.contiguous(), p = pd_bboxes.contiguous();
  pair_overlaps_kernel<<<blocks_for(n), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
      g.data_ptr<float>(), p.data_ptr<float>(), n, static_cast<int>(D), out.data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(lucid, CUDA, m) { m.impl("pair_overlaps", &pair_overlaps_cuda); }

}  // namespace gpu
}  // namespace lucid
