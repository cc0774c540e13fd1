// The dense pass ops on the GPU: pair_overlaps (one thread per pair), box_metrics (one thread per (b, m, a)) and
// resolve_conflicts (one thread per (b, a)). Same geometry and the same per-box values as the fused assign
// (assign_cuda.cu), so each matches its reference step bit for bit. float32 boxes.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/macros/Macros.h>
#include <torch/library.h>

#include <limits>

#include "checks.h"
#include "geometry.h"

namespace lucid {
namespace {

constexpr int kThreads = 256;

// Overlap of box g and box p (D = 4 or 5), clamped at 0, with the per-box values computed here as assign does.
__device__ float overlap_of(const float* g, const float* p, int D) {
  float o;
  if (D == 4) {
    const float eps = float(geom::kIouEps);
    const float ag = ::atan(geom::div(geom::sub(g[2], g[0]), geom::add(geom::sub(g[3], g[1]), eps)));
    const float ap = ::atan(geom::div(geom::sub(p[2], p[0]), geom::add(geom::sub(p[3], p[1]), eps)));
    o = geom::ciou<float>(g[0], g[1], g[2], g[3], p[0], p[1], p[2], p[3], ag, ap);
  } else {
    const auto gg = geom::gaussian<float, true>(g[2], g[3], ::cos(g[4]), ::sin(g[4]));
    const auto pg = geom::gaussian<float, true>(p[2], p[3], ::cos(p[4]), ::sin(p[4]));
    o = geom::probiou<float>(g[0], g[1], gg, p[0], p[1], pg);
  }
  return geom::clamp_min(o, 0.0f);
}

__global__ void pair_overlaps_kernel(const float* gt, const float* pd, int64_t n, int D, float* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = overlap_of(gt + i * D, pd + i * D, D);
}

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
    // the exponent is rounded to the score's dtype first, as PyTorch's pow does
    const double e = static_cast<double>(static_cast<S>(alpha));
    const float s = static_cast<float>(static_cast<S>(geom::pow_scalar(static_cast<float>(scores[p * C + label]), e)));
    overlaps[i] = o;
    align[i] = geom::mul(s, geom::pow_scalar(o, beta));
  }
}

__global__ void resolve_conflicts_kernel(const bool* mask, const float* ov, int64_t B, int64_t M, int64_t A,
                                         bool* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= B * A) return;
  const int64_t b = i / A, a = i % A;
  const int64_t base = b * M * A + a;
  int count = 0;
  for (int64_t m = 0; m < M && count < 2; ++m) count += mask[base + m * A];
  if (count < 2) return;
  int64_t best = 0;
  float best_v = ov[base];
  for (int64_t m = 1; m < M && !geom::isnan_(best_v); ++m) {
    const float v = ov[base + m * A];
    if (geom::isnan_(v) || v > best_v) {
      best = m;
      best_v = v;
    }
  }
  for (int64_t m = 0; m < M; ++m) out[base + m * A] = (m == best);
}

unsigned grid_for(int64_t n) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((n + kThreads - 1) / kThreads, 1 << 20)));
}

at::Tensor pair_overlaps_cuda(const at::Tensor& gt_bboxes, const at::Tensor& pd_bboxes) {
  TORCH_CHECK(gt_bboxes.dim() == 2 && (gt_bboxes.size(1) == 4 || gt_bboxes.size(1) == 5),
              "gt_bboxes must be (N, 4) or (N, 5), got ", gt_bboxes.sizes());
  TORCH_CHECK(pd_bboxes.sizes() == gt_bboxes.sizes(), "pd_bboxes must have the shape of gt_bboxes ",
              gt_bboxes.sizes(), ", got ", pd_bboxes.sizes());
  TORCH_CHECK(gt_bboxes.scalar_type() == at::kFloat && pd_bboxes.scalar_type() == at::kFloat,
              "on CUDA gt_bboxes and pd_bboxes must be float32, got ", gt_bboxes.scalar_type(), " and ",
              pd_bboxes.scalar_type());
  TORCH_CHECK(pd_bboxes.device() == gt_bboxes.device(), "gt_bboxes and pd_bboxes must be on one device");
  const c10::cuda::CUDAGuard guard(gt_bboxes.device());
  const int64_t n = gt_bboxes.size(0);
  auto out = at::empty({n}, gt_bboxes.options());
  if (n == 0) return out;
  const auto g = gt_bboxes.contiguous(), p = pd_bboxes.contiguous();
  TORCH_CHECK((n + kThreads - 1) / kThreads <= std::numeric_limits<int32_t>::max(), "pair_overlaps: too many pairs");
  pair_overlaps_kernel<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0,
                         at::cuda::getCurrentCUDAStream()>>>(g.data_ptr<float>(), p.data_ptr<float>(), n,
                                                             static_cast<int>(g.size(1)), out.data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

std::tuple<at::Tensor, at::Tensor> box_metrics_cuda(const at::Tensor& pd_scores, const at::Tensor& pd_bboxes,
                                                    const at::Tensor& gt_labels, const at::Tensor& gt_bboxes,
                                                    const at::Tensor& candidates, double alpha, double beta) {
  TORCH_CHECK(candidates.dim() == 3 && candidates.scalar_type() == at::kBool, "candidates must be (B, M, A) bool, got ",
              candidates.sizes(), " ", candidates.scalar_type());
  const int64_t B = candidates.size(0), M = candidates.size(1), A = candidates.size(2);
  TORCH_CHECK(pd_scores.dim() == 3 && pd_scores.size(0) == B && pd_scores.size(1) == A,
              "pd_scores must be (B, A, C) matching candidates ", candidates.sizes(), ", got ", pd_scores.sizes());
  check_assign_args(pd_scores, pd_bboxes, at::empty({A, 2}, pd_bboxes.options()), gt_labels, gt_bboxes,
                    at::empty({B, M}, candidates.options()), 1, 1, pd_scores.size(2), 1.0);
  TORCH_CHECK(gt_bboxes.scalar_type() == at::kFloat, "on CUDA the boxes must be float32, got ", gt_bboxes.scalar_type());
  TORCH_CHECK(candidates.device() == pd_scores.device(), "candidates must be on the device of pd_scores");
  const c10::cuda::CUDAGuard guard(pd_scores.device());
  auto align = at::empty(candidates.sizes(), pd_scores.options().dtype(at::kFloat));
  auto overlaps = at::empty(candidates.sizes(), pd_bboxes.options());
  if (align.numel() == 0) return {align, overlaps};
  const auto scores = pd_scores.contiguous(), pd = pd_bboxes.contiguous(), gt = gt_bboxes.contiguous();
  const auto labels = gt_labels.reshape({B, M}).to(at::kLong).contiguous();
  const auto cand = candidates.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, scores.scalar_type(), "box_metrics_cuda", [&] {
    box_metrics_kernel<scalar_t><<<grid_for(B * M * A), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        scores.data_ptr<scalar_t>(), pd.data_ptr<float>(), labels.data_ptr<int64_t>(), gt.data_ptr<float>(),
        cand.data_ptr<bool>(), B, M, A, scores.size(2), static_cast<int>(gt.size(2)), alpha, beta,
        align.data_ptr<float>(), overlaps.data_ptr<float>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {align, overlaps};
}

at::Tensor resolve_conflicts_cuda(const at::Tensor& mask_pos, const at::Tensor& overlaps) {
  TORCH_CHECK(mask_pos.dim() == 3 && mask_pos.scalar_type() == at::kBool, "mask_pos must be (B, M, A) bool, got ",
              mask_pos.sizes(), " ", mask_pos.scalar_type());
  TORCH_CHECK(overlaps.sizes() == mask_pos.sizes(), "overlaps must have the shape of mask_pos ", mask_pos.sizes(),
              ", got ", overlaps.sizes());
  TORCH_CHECK(overlaps.scalar_type() == at::kFloat, "on CUDA overlaps must be float32, got ", overlaps.scalar_type());
  TORCH_CHECK(overlaps.device() == mask_pos.device(), "mask_pos and overlaps must be on one device");
  const c10::cuda::CUDAGuard guard(mask_pos.device());
  const int64_t B = mask_pos.size(0), M = mask_pos.size(1), A = mask_pos.size(2);
  const auto mp = mask_pos.contiguous();
  auto out = mp.clone();
  if (out.numel() == 0) return out;
  const auto ov = overlaps.contiguous();
  TORCH_CHECK((B * A + kThreads - 1) / kThreads <= std::numeric_limits<int32_t>::max(), "resolve_conflicts: too large");
  resolve_conflicts_kernel<<<static_cast<unsigned>((B * A + kThreads - 1) / kThreads), kThreads, 0,
                             at::cuda::getCurrentCUDAStream()>>>(mp.data_ptr<bool>(), ov.data_ptr<float>(), B, M, A,
                                                                 out.data_ptr<bool>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(lucid, CUDA, m) {
  m.impl("pair_overlaps", &pair_overlaps_cuda);
  m.impl("box_metrics", &box_metrics_cuda);
  m.impl("resolve_conflicts", &resolve_conflicts_cuda);
}

}  // namespace lucid
