// torch.ops.lucid.box_metrics on the GPU (step 2, dense): one thread per (b, m, a); at a candidate pair the overlap
// (overlap_metric.cuh) and the metric (rules::align_metric), 0 elsewhere. float32 boxes.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/macros/Macros.h>
#include <torch/library.h>

#include <algorithm>

#include "checks.h"
#include "cuda/launch.cuh"
#include "cuda/overlap_metric.cuh"
#include "rules.h"

namespace lucid {
namespace gpu {
namespace {

template <typename S>
__global__ void box_metrics_kernel(const S* scores, const float* pd, const int64_t* labels, const float* gt,
                                   const bool* cand, int64_t B, int64_t M, int64_t A, int64_t C, int D, double alpha,
                                   double beta, float* align, float* overlaps) {
  const int64_t total = B * M * A;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (!cand[i]) {
      align[i] = 0.0f;
      overlaps[i] = 0.0f;
      continue;
    }
    const int64_t a = i % A, row = i / A, b = row / M;
    const int64_t p = b * A + a;
    const float o = overlap_of(gt + row * D, pd + p * D, D);
    const int64_t label = labels[row];
    CUDA_KERNEL_ASSERT(label >= 0 && label < C && "gt_labels: a candidate pair has a label outside [0, C)");
    overlaps[i] = o;
    align[i] = rules::align_metric<S, float>(scores[p * C + label], o, alpha, beta);
  }
}

std::tuple<at::Tensor, at::Tensor> box_metrics_cuda(const at::Tensor& pd_scores, const at::Tensor& pd_bboxes,
                                                    const at::Tensor& gt_labels, const at::Tensor& gt_bboxes,
                                                    const at::Tensor& candidates, double alpha, double beta) {
  const PairDims d = check_box_metrics_args(pd_scores, pd_bboxes, gt_labels, gt_bboxes, candidates);
  TORCH_CHECK_TYPE(gt_bboxes.scalar_type() == at::kFloat, "on CUDA the boxes must be float32, got ",
                   gt_bboxes.scalar_type());
  const c10::cuda::CUDAGuard guard(pd_scores.device());
  auto align = at::empty(candidates.sizes(), pd_scores.options().dtype(at::kFloat));
  auto overlaps = at::empty(candidates.sizes(), pd_bboxes.options());
  if (align.numel() == 0) return {align, overlaps};
  const auto scores = pd_scores.contiguous(), pd = pd_bboxes.contiguous(), gt = gt_bboxes.contiguous();
  const auto labels = gt_labels.reshape({d.B, d.M}).to(at::kLong).contiguous();
  const auto cand = candidates.contiguous();
  // a grid-stride loop: at most 2^20 blocks
  const unsigned grid = std::min<unsigned>(blocks_for(d.B * d.M * d.A), 1u << 20);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, scores.scalar_type(), "box_metrics_cuda", [&] {
    box_metrics_kernel<scalar_t><<<grid, kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        scores.data_ptr<scalar_t>(), pd.data_ptr<float>(), labels.data_ptr<int64_t>(), gt.data_ptr<float>(),
        cand.data_ptr<bool>(), d.B, d.M, d.A, d.C, static_cast<int>(d.D), alpha, beta, align.data_ptr<float>(),
        overlaps.data_ptr<float>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {align, overlaps};
}

}  // namespace

TORCH_LIBRARY_IMPL(lucid, CUDA, m) { m.impl("box_metrics", &box_metrics_cuda); }

}  // namespace gpu
}  // namespace lucid
