// What an autocast region changes in the assignment, for the autocast kernels (ops.cpp) and both backends.
//
// The fused ops take the region as an argument, `autocast_dtype` (the region's lower-precision dtype on the inputs'
// device; None outside one), never as thread-local state: a graph that torch.compile records, or a call replayed
// outside the region, then computes what the call computed inside it. The autocast kernels fill the argument from
// the region they are called in (when the caller left it None); a caller may also pass it itself.
//
// - CUDA autocast runs `pow` in float32 (it is on PyTorch's autocast-to-float32 list): under torch.autocast("cuda"),
//   the reference's (and the peer's) s.pow(alpha) of float16/bfloat16 scores is the float32 power of the widened
//   scores, neither rounded to the score dtype nor with a rounded exponent. The CUDA kernel computes exactly that,
//   reading each score once in its own dtype (no float32 copy of the scores). CPU autocast leaves `pow` in the input
//   dtype.
// - The segmentation assignment decodes masks with a matrix product, which autocast (CUDA and CPU) runs in its
//   lower-precision dtype (matmul is on the autocast-to-lower-precision lists): the decode casts its operands as
//   autocast would (mask_decode.h).
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Optional.h>

namespace lucid {

using AutocastDtype = c10::optional<c10::ScalarType>;

// True when s^alpha is the float32 power of the widened scores: float16/bfloat16 scores on CUDA inside an autocast
// region.
inline bool scores_pow_in_float32(const AutocastDtype& autocast_dtype, c10::DeviceType device,
                                  c10::ScalarType scores) {
  return autocast_dtype.has_value() && device == c10::DeviceType::CUDA &&
         (scores == c10::ScalarType::Half || scores == c10::ScalarType::BFloat16);
}

}  // namespace lucid
