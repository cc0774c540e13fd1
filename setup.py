"""Build of lucid_assign._C: the C++ (always) and CUDA (when available) kernels behind torch.ops.lucid.*.

Install with `pip install --no-build-isolation .`: the extension must be compiled against the torch that will import
it, and build isolation would install a different torch into a throwaway environment.

Knobs (environment variables):
  FORCE_CUDA=1            compile the CUDA sources even when no GPU is visible (needs a CUDA build of torch and nvcc)
  FORCE_CUDA=0            never compile them
  TORCH_CUDA_ARCH_LIST    GPU architectures, e.g. "9.0" (read by torch.utils.cpp_extension)
  MAX_JOBS                parallel compile jobs (read by torch.utils.cpp_extension; defaults to the core count)
  CUDA_HOME               the CUDA toolkit; when unset, /usr/local/cuda is used if it holds nvcc
  DEBUG=1                 -O0 -g (and -lineinfo for CUDA)
Fast-math is never used: the kernels must reproduce the reference bit for bit.
"""

import glob
import os
import shutil
import sys

from setuptools import setup

ROOT = os.path.dirname(os.path.abspath(__file__))


def _default_cuda_home():
    """Point CUDA_HOME at a standard toolkit before torch guesses it from the `nvcc` on PATH.

    torch takes the parent of the folder holding `nvcc`; a wrapper script in /usr/local/bin makes that /usr/local,
    which has no CUDA headers. A toolkit at /usr/local/cuda (or the real location of nvcc) is the better guess.
    """
    if os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH"):
        return
    candidates = ["/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    for home in candidates:
        if os.path.exists(os.path.join(home, "bin", "nvcc")) and os.path.exists(
            os.path.join(home, "include", "cuda_runtime.h")
        ):
            os.environ["CUDA_HOME"] = home
            return


_default_cuda_home()

import torch  # noqa: E402  (CUDA_HOME must be settled before cpp_extension reads it)
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension  # noqa: E402


def _want_cuda():
    force = os.environ.get("FORCE_CUDA", "")
    if force == "0":
        return False, "FORCE_CUDA=0"
    if torch.version.cuda is None:
        if force == "1":
            sys.exit("FORCE_CUDA=1 but this torch has no CUDA support (torch %s)" % torch.__version__)
        return False, "torch %s has no CUDA support" % torch.__version__
    if CUDA_HOME is None:
        if force == "1":
            sys.exit("FORCE_CUDA=1 but no CUDA toolkit was found: set CUDA_HOME")
        return False, "no CUDA toolkit found (set CUDA_HOME)"
    if force == "1":
        return True, "FORCE_CUDA=1"
    if torch.cuda.is_available():
        return True, "a GPU is visible"
    return False, "no GPU visible (set FORCE_CUDA=1 to build the CUDA kernels anyway)"


def _missing_cuda_headers_dir():
    """ATen's CUDA headers include cuSPARSE/cuBLAS/cuSOLVER headers that an nvcc-only toolkit may lack.

    pip's CUDA build of torch brings them in the `nvidia/cu13` (or cu12) package. Rather than putting that whole
    folder ahead of the toolkit (its cuda_runtime.h could shadow the toolkit's), link only the headers the toolkit
    lacks into a folder of our own and add that folder to the include path.
    """
    toolkit_inc = os.path.join(CUDA_HOME, "include")
    if os.path.exists(os.path.join(toolkit_inc, "cusparse.h")):
        return None
    sources = []
    try:
        import nvidia  # namespace package of pip's CUDA libraries

        for base in list(nvidia.__path__):
            for sub in ("cu13", "cu12", "cusparse", "cublas", "cusolver"):
                inc = os.path.join(base, sub, "include")
                if os.path.isdir(inc):
                    sources.append(inc)
    except ImportError:
        pass
    if not any(os.path.exists(os.path.join(s, "cusparse.h")) for s in sources):
        sys.exit(
            "The CUDA toolkit at %s has no cusparse.h, which ATen's CUDA headers need, and no pip package "
            "`nvidia-*` provides it. Install the toolkit's math libraries or torch's CUDA wheels." % CUDA_HOME
        )
    shim = os.path.join(ROOT, "build", "lucid_cuda_include")
    os.makedirs(shim, exist_ok=True)
    have = set(os.listdir(toolkit_inc))
    for src in sources:
        for name in os.listdir(src):
            dst = os.path.join(shim, name)
            if name in have or os.path.lexists(dst):
                continue
            os.symlink(os.path.join(src, name), dst)
            have.add(name)
    return shim


def _write_build_info(with_cuda, why):
    """Record how the library was built, for `lucid-assign doctor`."""
    info = dict(torch=torch.__version__, cuda=with_cuda, why=why, arch_list=os.environ.get("TORCH_CUDA_ARCH_LIST"),
                cuda_home=CUDA_HOME if with_cuda else None)
    with open(os.path.join(ROOT, "lucid_assign", "_build_info.py"), "w") as f:
        f.write('"""Written by setup.py at build time."""\n\nBUILD = %r\n' % (info,))


def extensions():
    debug = os.environ.get("DEBUG", "0") == "1"
    with_cuda, why = _want_cuda()
    print("lucid-assign: CUDA kernels %s (%s)" % ("ON" if with_cuda else "OFF", why))
    _write_build_info(with_cuda, why)

    sources = [os.path.join("csrc", "ops.cpp"), os.path.join("csrc", "python_module.cpp")]
    sources += sorted(glob.glob(os.path.join("csrc", "cpu", "*.cpp")))
    # The host compiler must not fuse a*b+c either: the CPU kernels share the geometry header with CUDA.
    cxx = ["-O0", "-g"] if debug else ["-O3"]
    cxx += ["-ffp-contract=off", "-fno-fast-math"]  # the C++ standard is the one torch asks for
    # at::parallel_for is an inline OpenMP region in torch's headers: without -fopenmp it runs on one thread.
    cxx += ["-fopenmp"]
    include_dirs = [os.path.join(ROOT, "csrc")]
    extra = {"cxx": cxx}
    ext_cls = CppExtension
    if with_cuda:
        sources += sorted(glob.glob(os.path.join("csrc", "cuda", "*.cu")))
        nvcc = ["-O0", "-g", "-G", "-lineinfo"] if debug else ["-O3", "-lineinfo"]
        # No --use_fast_math; no fused multiply-add where the reference rounds separately.
        nvcc += ["--fmad=false", "-Xcompiler", "-ffp-contract=off"]
        extra["nvcc"] = nvcc
        ext_cls = CUDAExtension
        shim = _missing_cuda_headers_dir()
        if shim:
            include_dirs.append(shim)
        extra["cxx"] = cxx + ["-DLUCID_WITH_CUDA"]
    return [
        ext_cls(
            name="lucid_assign._C",
            sources=sources,
            include_dirs=include_dirs,
            extra_compile_args=extra,
            extra_link_args=["-fopenmp"],  # resolves to the libgomp.so.1 that torch already loaded
        )
    ]


setup(
    ext_modules=extensions(),
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
