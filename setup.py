"""Build of lucid_assign._C: the C++ (always) and CUDA (when available) kernels behind torch.ops.lucid.*.

The library links against the torch that will import it, so it is compiled against the torch installed in the
environment it goes to:
  - `pip install --no-build-isolation .` (or `lucid-assign` from an sdist): the torch of the running environment;
  - plain `pip install` (build isolation): pip hides the environment's site-packages from the build, and this file
    looks there for torch and builds against it;
  - otherwise (no torch installed, or an isolated build environment that would use another torch) it stops with one
    line that says what to run.
Commands that only describe or pack the project (metadata, sdist) need no torch.

Knobs (environment variables):
  FORCE_CUDA=1            compile the CUDA sources even when no GPU is visible (needs a CUDA build of torch)
  FORCE_CUDA=0            never compile them
  TORCH_CUDA_ARCH_LIST    GPU architectures, e.g. "9.0" or "8.0;9.0+PTX" (read by torch.utils.cpp_extension)
  MAX_JOBS                parallel compile jobs (read by torch.utils.cpp_extension; defaults to the core count)
  CUDA_HOME               the CUDA toolkit; when unset, /usr/local/cuda is used if it holds nvcc; with no toolkit
                          and a torch built with CUDA 13 or later, the package index's compiler of that CUDA release
                          (nvidia-cuda-nvcc and the packages it needs) is installed into build/cuda-<release> and used
  DEBUG=1                 -O0 -g (and -lineinfo for CUDA)
  LUCID_LOCAL_VERSION=1   append what the build is for to the version, e.g. 0.2.0+pt214cu130, and require that torch
                          minor (scripts/build_wheel.sh sets it)
Fast-math is never used: the kernels must reproduce the reference bit for bit.
"""

import glob
import importlib.metadata
import os
import pprint
import sys
import sysconfig

from setuptools import setup

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, ROOT)
from build_tools import cuda_toolchain  # noqa: E402  (the CUDA toolchain's search: a kit, or the index's compiler)
from build_tools.cuda_toolchain import stop as _stop  # noqa: E402

TORCH_MIN = (2, 4)  # the first torch with torch.library.register_fake and autocast queries by device type, which
# lucid_assign/ops.py needs; built and tested from there (README: install)
# commands that compile the library; the others (egg_info, dist_info, sdist, ...) need no torch
BUILD_COMMANDS = {"build", "build_ext", "bdist_wheel", "bdist_egg", "install", "develop", "editable_wheel"}
NO_ISOLATION = ("pip install --no-build-isolation lucid-assign (from a clone: pip install --no-build-isolation .; "
                "setuptools, wheel and ninja must be installed)")


def _version():
    about = {}
    with open(os.path.join(ROOT, "lucid_assign", "_version.py")) as f:
        exec(f.read(), about)
    return about["__version__"]


def _import_torch():
    """Import the torch that lucid-assign will run with, or stop with the command to run."""
    on_path = {os.path.normcase(os.path.abspath(p)) for p in sys.path}
    env_dirs = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    # pip's isolated build runs this interpreter with the environment's own site-packages taken off sys.path
    hidden = [d for d in env_dirs if os.path.isdir(d) and os.path.normcase(os.path.abspath(d)) not in on_path]
    env_torch = next(iter(importlib.metadata.distributions(name="torch", path=hidden)), None) if hidden else None
    try:
        import torch
    except ImportError:
        if env_torch is None:
            _stop("the kernels are compiled against the torch they run with, and no torch is installed here: "
                  "install torch first, then install lucid-assign again (pip builds it against that torch; "
                  f"builders that isolate the build in an environment of their own need: {NO_ISOLATION})")
        sys.path.extend(hidden)  # build against the environment's torch, not a throwaway one
        import torch
    else:
        if env_torch is not None and env_torch.version != torch.__version__:
            _stop(f"this build would compile against torch {torch.__version__} of an isolated build environment, "
                  f"but torch {env_torch.version} is installed where lucid-assign goes: run {NO_ISOLATION}")
    found = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    if found < TORCH_MIN:
        _stop(f"needs torch >= {'.'.join(map(str, TORCH_MIN))}, found {torch.__version__}: upgrade torch, then "
              "install lucid-assign again")
    return torch


def _local_tag(torch, with_cuda):
    """What a wheel was built for: pt<major><minor> and cu<cuda version> or cpu, e.g. pt214cu130."""
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    cuda = "cu" + torch.version.cuda.replace(".", "") if with_cuda else "cpu"
    return f"pt{major}{minor}{cuda}"


def _write_build_info(info):
    """Record how the library was built: lucid_assign._library compares it with the running torch before loading
    the library, and `lucid-assign doctor` prints it."""
    with open(os.path.join(ROOT, "lucid_assign", "_build_info.py"), "w") as f:
        text = pprint.pformat(info, width=110, sort_dicts=False)
        f.write(f'"""Written by setup.py at build time."""\n\nBUILD = {text}\n')


def _extension(torch, with_cuda, cuda_home):
    from torch.utils.cpp_extension import CppExtension, CUDAExtension

    debug = os.environ.get("DEBUG", "0") == "1"
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
        shim = cuda_toolchain.missing_headers_dir(cuda_home, ROOT)
        if shim:
            include_dirs.append(shim)
        extra["cxx"] = cxx + ["-DLUCID_WITH_CUDA"]
    # The library uses the dispatcher only (no pybind11, no libtorch_python) and a module init of CPython's stable
    # ABI, so one build serves every Python >= 3.10 (the file is _C.abi3.so; a wheel is tagged cp310-abi3).
    return ext_cls(
        name="lucid_assign._C",
        sources=sources,
        include_dirs=include_dirs,
        extra_compile_args=extra,
        extra_link_args=["-fopenmp"],  # resolves to the libgomp.so.1 that torch already loaded
        py_limited_api=True,
    )


def main():
    version = _version()
    local = os.environ.get("LUCID_LOCAL_VERSION", "0") == "1"
    building = bool(BUILD_COMMANDS & set(sys.argv[1:]))
    kwargs = dict(install_requires=["torch>=%d.%d" % TORCH_MIN])
    if building or local:
        torch = _import_torch()
        with_cuda, why, compiler = cuda_toolchain.find(torch, ROOT)
        from torch.utils.cpp_extension import CUDA_HOME, BuildExtension

        if local:
            version += "+" + _local_tag(torch, with_cuda)
            major, minor = (int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
            kwargs["install_requires"] = [f"torch>={major}.{minor},<{major}.{minor + 1}"]
        if building:
            print("lucid-assign: building against torch %s (%s), CUDA kernels %s (%s)%s"
                  % (torch.__version__, os.path.dirname(torch.__file__), "ON" if with_cuda else "OFF", why,
                     ", " + compiler if compiler else ""), flush=True)
            _write_build_info(dict(version=version, torch=torch.__version__, cuda=with_cuda, why=why,
                                   compiler=compiler, torch_cuda=torch.version.cuda if with_cuda else None,
                                   arch_list=os.environ.get("TORCH_CUDA_ARCH_LIST") if with_cuda else None))
            kwargs.update(
                ext_modules=[_extension(torch, with_cuda, CUDA_HOME)],
                cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
                options={"bdist_wheel": {"py_limited_api": "cp310"}},
            )
    setup(version=version, **kwargs)


main()
