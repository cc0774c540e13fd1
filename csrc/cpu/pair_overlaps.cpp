// torch.ops.lucid.pair_overlaps on the CPU (step 2): the overlap of paired boxes, CIoU or probiou, clamped at 0.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <vector>

#include "checks.h"
#include "cpu/overlap_metric.h"

namespace lucid {
namespace cpu {
namespace {

at::Tensor pair_overlaps_cpu(const at::Tensor& gt_bboxes, const at::Tensor& pd_bboxes) {
  const int64_t d = check_pair_overlaps_args(gt_bboxes, pd_bboxes), n = gt_bboxes.size(0);
  auto out = at::empty({n}, gt_bboxes.options());
  if (n == 0) return out;
  const auto g = gt_bboxes.contiguous(), p = pd_bboxes.contiguous();
  AT_DISPATCH_FLOATING_TYPES(g.scalar_type(), "pair_overlaps_cpu", [&] {
    const auto gp = BoxPrep<scalar_t>::make(g), pp = BoxPrep<scalar_t>::make(p);
    scalar_t* o = out.data_ptr<scalar_t>();
    at::parallel_for(0, n, 2048, [&](int64_t begin, int64_t end) {
      OverlapBatch<scalar_t> batch(g.data_ptr<scalar_t>(), gp, p.data_ptr<scalar_t>(), pp, d);
      std::vector<int64_t> idx(end - begin);
      for (int64_t i = begin; i < end; ++i) idx[i - begin] = i;
      batch.run(idx.data(), idx.data(), end - begin, o + begin);
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(lucid, CPU, m) { m.impl("pair_overlaps", &pair_overlaps_cpu); }

}  // namespace cpu
}  // namespace lucid
