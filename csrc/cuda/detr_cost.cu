// torch.ops.lucid.detr_cost on the GPU (docs/spec.md, "DETR matching cost"): one thread per (image, query, column),
// detr_cost.h's column cost, in one launch with no host synchronisation. The scores are read in their own
// dtype (widened exactly); the boxes are taken to float32 first, as the peer takes them.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <math_constants.h>

#include <algorithm>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

#include "checks.h"
#include "cuda/launch.cuh"
#include "detr_cost.h"

namespace lucid {
namespace gpu {
namespace {

constexpr int kMaxGridY = 65535;

// The strides of an (L, B, Q, .) tensor, passed by value to a kernel.
struct Strides4 {
  int64_t s0, s1, s2, s3;
};

Strides4 strides4(const at::Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2), t.stride(3)}; }

// Blocks of (x: query-columns of one image, y: images in turn); each column's cost by detr::column_cost.
template <typename T>
__global__ void detr_cost_kernel(const float* __restrict__ pd, const T* __restrict__ scores,
                                 const float* __restrict__ gt, const int64_t* __restrict__ cls,
                                 const int64_t* __restrict__ sizes, int64_t B, int64_t Q, int64_t C, int64_t N,
                                 int64_t W, detr::CostSettings s, float* __restrict__ out) {
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

// Blocks of (x: query-columns of one image of one layer, y: (layer, image) pairs in turn); each entry by
// detr::family_cost, its class term from the query's score of the object's class or the given one, the query's box
// widened to float32 (exact), both read in their dtypes with their strides. Columns past the image's objects are 0.
// A query's corners are checked by its column-0 thread, an object's by the threads of query 0 in layer 0; any invalid
// one, and for RF-DETR any query's box or object's cost that fails its checks, sets invalid[0] (every writer writes 1).
template <typename T, typename TB>
__global__ void family_cost_kernel(const T* __restrict__ scores, Strides4 ss, const TB* __restrict__ boxes,
                                   Strides4 bs, const float* __restrict__ objects, const int64_t* __restrict__ labels,
                                   const int64_t* __restrict__ sizes, const float* __restrict__ class_cost, int64_t L,
                                   int64_t B, int64_t Q, int64_t C, int64_t W, detr::FamilySettings s,
                                   float* __restrict__ out, int* __restrict__ invalid) {
  __shared__ int64_t start, count;
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t lb = blockIdx.y; lb < L * B; lb += gridDim.y) {
    const int64_t l = lb / B, b = lb - l * B;
    __syncthreads();  // the previous pair's start and count are read by every thread before they change
    if (threadIdx.x == 0) {
      int64_t total = 0;
      for (int64_t k = 0; k < b; ++k) total += sizes[k];
      start = total, count = sizes[b];
    }
    __syncthreads();
    if (e >= Q * W) continue;
    const int64_t q = e / W, j = e - q * W, row = lb * Q + q;
    const TB* box = boxes + l * bs.s0 + b * bs.s1 + q * bs.s2;
    const float pd[4] = {static_cast<float>(box[0]), static_cast<float>(box[bs.s3]),
                         static_cast<float>(box[2 * bs.s3]), static_cast<float>(box[3 * bs.s3])};
    float c[4];
    if (j == 0) {
      detr::family_corners(pd, s.pred_corners, s, c);
      if (detr::family_corners_raise(c, s) || detr::family_query_declines(pd, s)) invalid[0] = 1;
    }
    float v = 0.0f;
    if (j < count) {
      const int64_t k = start + j, cls = labels[k];
      if (l == 0 && q == 0) {
        detr::family_corners(objects + k * 4, s.gt_corners, s, c);
        if (detr::family_corners_raise(c, s)) invalid[0] = 1;
      }
      if (cls < 0 || cls >= C) {
        v = CUDART_NAN_F;
      } else {
        const float term =
            class_cost != nullptr
                ? class_cost[row * W + j]
                : detr::class_term(static_cast<float>(scores[l * ss.s0 + b * ss.s1 + q * ss.s2 + cls * ss.s3]), s);
        v = detr::family_cost(term, pd, objects + k * 4, s);
      }
      if (detr::family_entry_declines(v, s)) invalid[0] = 1;
    }
    out[row * W + j] = v;
  }
}

// The objects, their labels and the sizes as the family kernel reads them (float32, int64, contiguous: no copy where
// they are so already).
struct FamilyObjects {
  at::Tensor objects, labels, sizes;
};

FamilyObjects family_objects(const at::Tensor& objects, const at::Tensor& labels, const at::Tensor& sizes) {
  return {objects.to(at::kFloat).contiguous(), labels.to(at::kLong).contiguous(), sizes.to(at::kLong).contiguous()};
}

// One stack's launch of family_cost_kernel on the current stream, its (L * B * G, Q / G, W) cost written at out and
// its checks at invalid.
void launch_family_cost(const at::Tensor& scores, const at::Tensor& boxes, const FamilyObjects& o,
                        const at::Tensor& class_cost, const FamilyCostDims& d, const detr::FamilySettings& s,
                        float* out, int* invalid) {
  if (d.L * d.B * d.Q * d.W == 0) return;
  const dim3 grid(blocks_for(d.Q * d.W), static_cast<unsigned>(std::min<int64_t>(d.L * d.B, kMaxGridY)));
  const auto stream = at::cuda::getCurrentCUDAStream();
  const Strides4 ss = strides4(scores), bs = strides4(boxes);
  const float* cc = class_cost.defined() ? class_cost.data_ptr<float>() : nullptr;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, boxes.scalar_type(), "family_cost_boxes", [&] {
    using box_t = scalar_t;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, scores.scalar_type(), "family_cost_scores", [&] {
      family_cost_kernel<scalar_t, box_t><<<grid, kThreads, 0, stream>>>(
          scores.data_ptr<scalar_t>(), ss, boxes.data_ptr<box_t>(), bs, o.objects.data_ptr<float>(),
          o.labels.data_ptr<int64_t>(), o.sizes.data_ptr<int64_t>(), cc, d.L, d.B, d.Q, d.C, d.W, s, out, invalid);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
}

std::tuple<at::Tensor, at::Tensor> detr_family_cost_cuda(
    const at::Tensor& scores, const at::Tensor& boxes, const at::Tensor& labels, const at::Tensor& objects,
    const at::Tensor& sizes, int64_t width, int64_t groups, c10::ArrayRef<double> gains, int64_t class_term,
    double alpha, double gamma, int64_t l1_order, c10::ArrayRef<int64_t> dtypes, bool sanitize, double top,
    const c10::optional<at::Tensor>& class_cost) {
  const FamilyCostDims d = check_family_cost_args(scores, boxes, labels, objects, sizes, width, groups, gains,
                                                  class_term, gamma, l1_order, dtypes, class_cost);
  const c10::cuda::CUDAGuard guard(scores.device());
  const auto s = detr::make_family_settings(gains[0], gains[1], gains[2], class_term, alpha, gamma, l1_order,
                                            dtypes.data(), sanitize, top);
  auto out = at::empty({d.L * d.B * d.G, d.Q / d.G, d.W}, scores.options().dtype(at::kFloat));
  auto invalid = at::zeros({1}, scores.options().dtype(at::kInt));
  if (out.numel() == 0) return {out, invalid};
  const at::Tensor cc = class_cost.has_value() ? class_cost->to(at::kFloat).contiguous() : at::Tensor();
  launch_family_cost(scores, boxes, family_objects(objects, labels, sizes), cc, d, s, out.data_ptr<float>(),
                     invalid.data_ptr<int>());
  return {out, invalid};
}

// torch.ops.lucid.detr_cost.parts on the GPU: detr_cost.family's kernel for each part, writing its problems at their
// place in one result, every part's checks in one flag; the class term computed in the kernel (of the softmax's
// probabilities, one ATen launch a part, where class_kind is 0: the family's own softmax in the call's autocast
// region).
std::tuple<at::Tensor, at::Tensor> detr_family_parts_cuda(
    at::TensorList score_parts, at::TensorList box_parts, const at::Tensor& labels, const at::Tensor& objects,
    const at::Tensor& sizes, int64_t width, int64_t groups, c10::ArrayRef<double> gains, int64_t class_kind,
    double alpha, double gamma, int64_t l1_order, c10::ArrayRef<int64_t> dtypes, bool sanitize, double top) {
  const auto score_stacks = parts_as_stacks(score_parts), box_stacks = parts_as_stacks(box_parts);
  const at::TensorList scores(score_stacks), boxes(box_stacks);
  const auto dims = check_family_parts_args(scores, boxes, labels, objects, sizes, width, groups, gains, class_kind,
                                            gamma, l1_order, dtypes);
  const c10::cuda::CUDAGuard guard(scores[0].device());
  const at::NoGradGuard no_grad;  // the op's result is a constant (ops.cpp): the softmax records no graph
  int64_t problems = 0;
  for (const auto& d : dims) problems += d.L * d.B * d.G;
  const auto& d0 = dims[0];
  auto out = at::empty({problems, d0.Q / d0.G, d0.W}, scores[0].options().dtype(at::kFloat));
  auto invalid = at::zeros({1}, scores[0].options().dtype(at::kInt));
  if (out.numel() == 0) return {out, invalid};
  const auto o = family_objects(objects, labels, sizes);
  float* at_part = out.data_ptr<float>();
  for (size_t p = 0; p < dims.size(); ++p) {
    const auto& d = dims[p];
    const auto s = detr::make_family_settings(gains[0], gains[1], gains[2], parts_class_term(class_kind), alpha,
                                              gamma, l1_order, dtypes.data() + 9 * p, sanitize, top);
    const at::Tensor sc = class_kind == 0 ? scores[p].softmax(-1) : scores[p];
    launch_family_cost(sc, boxes[p], o, at::Tensor(), d, s, at_part, invalid.data_ptr<int>());
    at_part += d.L * d.B * d.Q * d.W;
  }
  return {out, invalid};
}

}  // namespace

TORCH_LIBRARY_IMPL(lucid, CUDA, m) {
  m.impl("detr_cost", &detr_cost_cuda);
  m.impl("detr_cost.family", &detr_family_cost_cuda);
  m.impl("detr_cost.parts", &detr_family_parts_cuda);
}

}  // namespace gpu
}  // namespace lucid
