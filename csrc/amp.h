// The power of the scores under CUDA autocast, shared by the autocast kernel (ops.cpp) and the CUDA assign.
//
// CUDA autocast runs `pow` in float32 (it is on PyTorch's autocast-to-float32 list): under torch.autocast("cuda"),
// the reference's (and the peer's) s.pow(alpha) of float16/bfloat16 scores is the float32 power of the widened
// scores, neither rounded to the score dtype nor with a rounded exponent. The autocast kernel of `assign` forwards
// the call with this flag set instead of widening the whole score tensor; the CUDA kernel then computes exactly
// what it computes for widened scores, reading each score once in its own dtype.
#pragma once

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

}  // namespace lucid
