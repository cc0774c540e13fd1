// The first launch of the fused assignment: prepare_kernel. Block 0 builds the anchor index (anchor_index.cuh);
// the other blocks clear the workspace's counters and prepare every box: per object its candidate region (step 1,
// containment.cuh) and per object and prediction the values its overlaps need (step 2, overlap_metric.cuh). For pose,
// block 0 also reads the anchors' strides, and each object row gets its pose values (level_gate.cuh).
#pragma once

#include <c10/macros/Macros.h>

#include <cstdint>

#include "cuda/anchor_index.cuh"
#include "cuda/level_gate.cuh"
#include "cuda/problem.cuh"

namespace lucid {
namespace gpu {

// An input of one value (or D values) per object row, (B, M[, k]) with any strides, as the caller passed it: the
// peer trainer's gt_labels and gt_bboxes are slices of one targets tensor, so they are not contiguous.
template <typename T>
struct RowsIn {
  const T* p;
  int64_t M, s0, s1, s2;  // strides of the batch, row and last dimensions
  __device__ T at(int64_t row, int k = 0) const { return p[(row / M) * s0 + (row % M) * s1 + k * s2]; }
};

// The per-row inputs as the kernels read them: valid (mask_gt != 0) and the labels as int64. float32 mask_gt and
// gt_labels (what trainers pass), of any strides, are converted here, by prepare_kernel, as ATen's ne(0) and to(int64)
// would; other dtypes are converted by ATen before the call (mask_f.p is then null).
struct RowInputs {
  RowsIn<float> mask_f;
  RowsIn<float> label_f;
  bool* valid;  // written here when mask_f.p is set, else already filled
  int64_t* labels;
  __device__ bool convert(int64_t row) const {
    if (mask_f.p == nullptr) return valid[row];
    const bool v = mask_f.at(row) != 0.0f;
    valid[row] = v;
    labels[row] = static_cast<int64_t>(label_f.at(row));
    return v;
  }
};

// Box j of the objects (is_gt) or of the predictions: the values its overlaps need and, for an object, its
// candidate region. An object's box is also copied, contiguous, to gt_copy, which every later kernel reads.
template <typename T>
__device__ void prepare_box(const RowsIn<T>& gt, T* __restrict__ gt_copy, const RowInputs& rows,
                            const T* __restrict__ pd, bool is_gt, int64_t j, int D, const geom::RuleSet<T>& rule,
                            const Regions<T>& regions, T* gvals, T* pvals) {
  bool real = false;
  T box[5] = {};  // in registers: every index below is known at compile time
  if (is_gt) real = rows.convert(j);
#pragma unroll
  for (int k = 0; k < 5; ++k) {
    if (k < D) {
      if (is_gt) {
        box[k] = gt_copy[j * D + k] = gt.at(j, k);
      } else {
        box[k] = pd[j * D + k];
      }
    }
  }
  const bool rotated = D == 5;
  const T c = rotated ? ::cos(box[4]) : T(0), s = rotated ? ::sin(box[4]) : T(0);
  box_values(box, D, c, s, (is_gt ? gvals : pvals) + j * kBoxValues);
  if (is_gt) regions.put(j, box, D, real, rule, c, s);
}

template <typename T>
struct PrepArgs {
  RowsIn<T> gt;  // (B, M, D), any strides
  T* gt_copy;    // (B*M, D)
  RowInputs rows;
  const T* pd;  // (B*A, D)
  AnchorsIn anc_in;
  int64_t n_rows, n_pred, A;
  int D;
  geom::RuleSet<T> rule;  // step 1 (geometry.h)
  Regions<T> regions;
  T* gvals;
  T* pvals;
  uint4* zero;  // the counters of the workspace, cleared here
  int64_t n_zero;
  float* anc;  // the anchors as float32, and their index
  int32_t* cell_of_anchor;
  Axis* axes;
  int32_t* offsets;
  int32_t* sorted;
  int32_t stage_cap;  // anchors placed through dynamic shared memory (its size: 4 bytes each)
  // pose (pose.on): the strides as given, where their float32 copy and extremes go, and the eps of the OKS scale
  PoseView pose;
  const void* strides_in;
  float* stride_out;
  float* extremes_out;
  float eps;
};

// Block 0 builds the anchor index while the others clear the counters and prepare every object and prediction box
// (thread i: object row i for i < B*M, then prediction i - B*M). Blocks of kPrepThreads fill a multiprocessor's
// registers, so the dynamic shared memory that only block 0 uses costs the others no occupancy.
template <typename T>
__global__ void __launch_bounds__(kPrepThreads) prepare_kernel(const PrepArgs<T> p) {
  if (blockIdx.x == 0) {
    extern __shared__ int32_t stage[];
    build_anchor_index(p.anc_in, static_cast<int32_t>(p.A), p.anc, p.cell_of_anchor, p.axes, p.offsets, p.sorted,
                       stage, p.stage_cap);
    if (p.pose.on) prepare_strides(p.strides_in, p.pose.stride_type, p.A, p.stride_out, p.extremes_out);
    return;
  }
  const int64_t i = static_cast<int64_t>(blockIdx.x - 1) * blockDim.x + threadIdx.x;
  const int64_t threads = static_cast<int64_t>(gridDim.x - 1) * blockDim.x;
  for (int64_t w = i; w < p.n_zero; w += threads) p.zero[w] = make_uint4(0u, 0u, 0u, 0u);
  if (i >= p.n_rows + p.n_pred) return;
  const bool is_gt = i < p.n_rows;
  prepare_box(p.gt, p.gt_copy, p.rows, p.pd, is_gt, is_gt ? i : i - p.n_rows, p.D, p.rule, p.regions, p.gvals,
              p.pvals);
  if (is_gt && p.pose.on) prepare_pose_row(p.pose, p.gt_copy + i * 4, i, p.eps);
}

}  // namespace gpu
}  // namespace lucid
