// torch.ops.lucid.resolve_conflicts on the GPU (step 4, dense): one thread per (b, a), rules::resolve_anchor over
// its M rows, as on the CPU. float32 overlaps.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "checks.h"
#include "cuda/launch.cuh"
#include "rules.h"

namespace lucid {
namespace gpu {
namespace {

__global__ void resolve_conflicts_dense_kernel(const bool* mask, const float* overlaps, int64_t B, int64_t M,
                                               int64_t A, bool* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= B * A) return;
  const int64_t base = (i / A) * M * A + i % A;
  rules::resolve_anchor(mask + base, overlaps + base, M, A, out + base);
}

at::Tensor resolve_conflicts_cuda(const at::Tensor& mask_pos, const at::Tensor& overlaps) {
  check_resolve_conflicts_args(mask_pos, overlaps);
  TORCH_CHECK_TYPE(overlaps.scalar_type() == at::kFloat, "on CUDA overlaps must be float32, got ",
                   overlaps.scalar_type());
  const c10::cuda::CUDAGuard guard(mask_pos.device());
  const int64_t B = mask_pos.size(0), M = mask_pos.size(1), A = mask_pos.size(2);
  const auto mp = mask_pos.contiguous();
  auto out = mp.clone();
  if (out.numel() == 0) return out;
  const auto ov = overlaps.contiguous();
  resolve_conflicts_dense_kernel<<<blocks_for(B * A), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
      mp.data_ptr<bool>(), ov.data_ptr<float>(), B, M, A, out.data_ptr<bool>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(lucid, CUDA, m) { m.impl("resolve_conflicts", &resolve_conflicts_cuda); }

}  // namespace gpu
}  // namespace lucid
