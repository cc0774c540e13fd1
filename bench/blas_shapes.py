"""The host cost of the segmentation decode's matrix product by shape: torch.matmul of bf16 (c, n, 32) @ (c, 32,
25,600) operands as the decode makes them (a slice of a (16, n0, 32) buffer; c images per chunk of 2^27 values), for
product shapes new to cuBLAS and for shapes it has seen.

    python bench/blas_shapes.py            # cuBLAS as PyTorch prefers it
    python bench/blas_shapes.py lt         # torch.backends.cuda.preferred_blas_library("cublaslt")
    CUDA_MODULE_LOADING=EAGER python bench/blas_shapes.py eager

"issue" is the host time of the call (until it returns), "total" the time to its end on the device. The first row
also loads cuBLAS's kernels (lazily, as they are first used); the rows after it show what a new shape costs once
they are loaded.
"""

import os
import statistics
import sys
import time

import torch

P = 160 * 160


def chunk(n):
    return min(16, max(1, (1 << 27) // (n * P)))


def main(mode="main"):
    dev = "cuda"
    torch.manual_seed(0)
    proto = torch.randn(16, 32, P, device=dev, dtype=torch.bfloat16)
    coef_buf = torch.randn(16 * 3000 * 32 + 64, device=dev, dtype=torch.bfloat16)

    def one(n, n0, c=None):
        c = c or chunk(n)
        lhs = coef_buf[: 16 * n0 * 32].view(16, n0, 32)[:c, :n]
        rhs = proto[:c]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        torch.matmul(lhs, rhs)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        return (t1 - t0) * 1e6, (t2 - t0) * 1e6

    def phase(name, shapes):
        issue, total = zip(*(one(*s) for s in shapes))
        q = statistics.quantiles(issue, n=10)
        print(f"{name:<44} n={len(shapes):4d} issue us: median {statistics.median(issue):7.1f} p10 {q[0]:7.1f} "
              f"p90 {q[-1]:7.1f} max {max(issue):8.1f} | total median {statistics.median(total):7.1f}", flush=True)

    print("mode", mode, "CUDA_MODULE_LOADING", os.environ.get("CUDA_MODULE_LOADING"), "blas",
          torch.backends.cuda.preferred_blas_library())
    if mode == "lt":
        torch.backends.cuda.preferred_blas_library("cublaslt")
        print("blas now", torch.backends.cuda.preferred_blas_library())
    one(200, 200)  # handle creation
    phase("new n (101..1500 step 13), n0 = n", [(n, n) for n in range(101, 1500, 13)])
    phase("same shapes again", [(n, n) for n in range(101, 1500, 13)])
    phase("new n (104..1500 step 13), n0 = n", [(n, n) for n in range(104, 1500, 13)])
    phase("seen n (101..), new batch stride n0 = n + 5", [(n, n + 5) for n in range(101, 1500, 13)])
    phase("seen n, seen stride, batch c-1", [(n, n, max(1, chunk(n) - 1)) for n in range(101, 1500, 13)])
    phase("new n (107..1500 step 13) again", [(n, n) for n in range(107, 1500, 13)])
    phase("seen n (107..) again", [(n, n) for n in range(107, 1500, 13)])
    # small-n all-16-images chunks, as at 20 objects per image
    phase("n 150..330 new, c=16", [(n, n) for n in range(150, 330, 2)])
    phase("n 150..330 seen, c=16", [(n, n) for n in range(150, 330, 2)])
    if mode == "main":
        # do cuBLAS and cuBLASLt give the same numbers for these shapes?
        diffs = 0
        for n in (150, 300, 640, 1300):
            lhs = coef_buf[: 16 * n * 32].view(16, n, 32)[: chunk(n)]
            a = torch.matmul(lhs, proto[: chunk(n)])
            torch.backends.cuda.preferred_blas_library("cublaslt")
            b = torch.matmul(lhs, proto[: chunk(n)])
            torch.backends.cuda.preferred_blas_library("cublas")
            diffs += int((a != b).sum())
        print("cublas vs cublaslt elements differing:", diffs)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "main")
