// Launch helpers of the GPU ops: grid sizes, and facts about a kernel asked of the driver once per device.
#pragma once

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <tuple>

namespace lucid {
namespace gpu {

constexpr int kThreads = 256;  // the block size of most kernels

// Launch facts of a kernel on the current device, asked of the driver once and then remembered (they cost more
// host time than a launch): its static shared memory, and how many blocks of a given size fit on one
// multiprocessor (at least 1). raise_smem_limit lets the kernel take `smem` bytes of dynamic shared memory.
struct KernelFacts {
  std::mutex mu;
  std::map<std::tuple<const void*, int, int, int64_t>, int64_t> values;  // (kernel, device, what/threads, smem)

  template <typename Kernel>
  int64_t get(Kernel kernel, int what, int64_t smem, const std::function<int64_t()>& ask) {
    int device = 0;
    C10_CUDA_CHECK(cudaGetDevice(&device));
    const auto key = std::make_tuple(reinterpret_cast<const void*>(kernel), device, what, smem);
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = values.find(key);
      if (it != values.end()) return it->second;
    }
    const int64_t v = ask();
    std::lock_guard<std::mutex> lock(mu);
    values[key] = v;
    return v;
  }
};
inline KernelFacts& kernel_facts() {
  static KernelFacts facts;
  return facts;
}

template <typename Kernel>
int64_t static_smem(Kernel kernel) {
  return kernel_facts().get(kernel, -1, 0, [&] {
    cudaFuncAttributes attr;
    C10_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
    return static_cast<int64_t>(attr.sharedSizeBytes);
  });
}

template <typename Kernel>
void raise_smem_limit(Kernel kernel, int64_t smem) {
  // the limit only ever goes up: a call with less dynamic shared memory must not lower it under a later call
  auto& facts = kernel_facts();
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  const auto key = std::make_tuple(reinterpret_cast<const void*>(kernel), device, -2, int64_t{0});
  std::lock_guard<std::mutex> lock(facts.mu);
  auto it = facts.values.find(key);
  if (it != facts.values.end() && it->second >= smem) return;
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  facts.values[key] = smem;
}

template <typename Kernel>
int64_t occupancy(Kernel kernel, int threads, int64_t smem) {
  return kernel_facts().get(kernel, threads, smem, [&] {
    int per_sm = 0;
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, static_cast<size_t>(smem)));
    return static_cast<int64_t>(std::max(per_sm, 1));
  });
}

// Blocks of `threads` for n threads (at least one block).
inline unsigned blocks_for(int64_t n, int threads = kThreads) {
  const int64_t b = (n + threads - 1) / threads;
  TORCH_CHECK(b <= std::numeric_limits<int32_t>::max(), "lucid: problem too large for one launch (", n,
              " threads)");
  return static_cast<unsigned>(b < 1 ? 1 : b);
}

// The grid of a kernel whose blocks take work items from a list in turn: as many blocks as fit on the device at
// once, and no more than there are items.
template <typename Kernel>
unsigned persistent_grid(Kernel kernel, int threads, int64_t smem, int64_t items) {
  const int64_t sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(items, sms * occupancy(kernel, threads, smem))));
}

}  // namespace gpu
}  // namespace lucid
