// torch.ops.lucid.resolve_conflicts on the CPU (step 4, dense): an anchor positive for several rows keeps only the
// first row with the largest overlap over all M rows (rules::resolve_anchor).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "checks.h"
#include "rules.h"

namespace lucid {
namespace cpu {
namespace {

at::Tensor resolve_conflicts_cpu(const at::Tensor& mask_pos, const at::Tensor& overlaps) {
  check_resolve_conflicts_args(mask_pos, overlaps);
  const int64_t B = mask_pos.size(0), M = mask_pos.size(1), A = mask_pos.size(2);
  const auto mp = mask_pos.contiguous();
  auto out = mp.clone();
  if (out.numel() == 0) return out;
  const auto ov = overlaps.contiguous();
  AT_DISPATCH_FLOATING_TYPES(ov.scalar_type(), "resolve_conflicts_cpu", [&] {
    const bool* m = mp.data_ptr<bool>();
    const scalar_t* o = ov.data_ptr<scalar_t>();
    bool* r = out.data_ptr<bool>();
    at::parallel_for(0, B * A, 1024, [&](int64_t begin, int64_t end) {
      for (int64_t ba = begin; ba < end; ++ba) {
        const int64_t base = (ba / A) * M * A + ba % A;
        rules::resolve_anchor(m + base, o + base, M, A, r + base);
      }
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(lucid, CPU, m) { m.impl("resolve_conflicts", &resolve_conflicts_cpu); }

}  // namespace cpu
}  // namespace lucid
