// The power of the scores under CUDA autocast, shared by the autocast kernel (ops.cpp) and the CUDA assign.
//
// CUDA autocast runs `pow` in float32 (it is on PyTorch's autocast-to-float32 list): under torch.autocast("cuda"),
// the reference's (and the peer's) s.pow(alpha) of float16/bfloat16 scores is the float32 power of the widened
// scores, neither rounded to the score dtype nor with a rounded exponent. The autocast kernel of `assign` forwards
// the call with this flag set instead of widening the whole score tensor; the CUDA kernel then computes exactly
// what it computes for widened scores, reading each score once in its own dtype.
//
// The segmentation assignment decodes masks with a matrix product, which CUDA autocast runs in its lower precision
// dtype (matmul is on the autocast-to-lower-precision list): the autocast kernel of `assign_seg` forwards the call
// with that dtype set here, and the decode casts its operands as autocast would (mask_decode.h).
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/util/Optional.h>

namespace lucid {

// True while the autocast kernel forwards a call of `assign` on this thread.
inline bool& scores_pow_in_float32() {
  thread_local bool on = false;
  return on;
}

struct ScoresPowInFloat32 {
  bool prev;
  explicit ScoresPowInFloat32(bool on) : prev(scores_pow_in_float32()) { scores_pow_in_float32() = on; }
  ~ScoresPowInFloat32() { scores_pow_in_float32() = prev; }
  ScoresPowInFloat32(const ScoresPowInFloat32&) = delete;
  ScoresPowInFloat32& operator=(const ScoresPowInFloat32&) = delete;
};

// The dtype CUDA autocast gives a matmul while the autocast kernel forwards a call of `assign_seg` on this thread.
inline c10::optional<c10::ScalarType>& autocast_matmul_dtype() {
  thread_local c10::optional<c10::ScalarType> dtype;
  return dtype;
}

struct AutocastMatmulDtype {
  c10::optional<c10::ScalarType> prev;
  explicit AutocastMatmulDtype(c10::optional<c10::ScalarType> dtype) : prev(autocast_matmul_dtype()) {
    autocast_matmul_dtype() = dtype;
  }
  ~AutocastMatmulDtype() { autocast_matmul_dtype() = prev; }
  AutocastMatmulDtype(const AutocastMatmulDtype&) = delete;
  AutocastMatmulDtype& operator=(const AutocastMatmulDtype&) = delete;
};

}  // namespace lucid
