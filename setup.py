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
import shutil
import sys
import sysconfig

from setuptools import setup

ROOT = os.path.dirname(os.path.abspath(__file__))
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


def _stop(why):
    sys.exit(f"lucid-assign: {why}")


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


def _want_cuda(torch):
    """Whether to compile the CUDA kernels, and why, before looking for a compiler."""
    force = os.environ.get("FORCE_CUDA", "")
    if force == "0":
        return False, "FORCE_CUDA=0"
    if torch.version.cuda is None:
        if force == "1":
            _stop("FORCE_CUDA=1 but this torch has no CUDA support (torch %s)" % torch.__version__)
        return False, "torch %s has no CUDA support" % torch.__version__
    if force == "1":
        return True, "FORCE_CUDA=1"
    if torch.cuda.is_available():
        return True, "a GPU is visible"
    return False, "no GPU visible (set FORCE_CUDA=1 to build the CUDA kernels anyway)"


# The package index's CUDA compiler (CUDA 13 and later): nvcc with cudafe++, ptxas, fatbinary and nvlink; cicc; the
# compiler's own headers; CUB and Thrust; the runtime's headers and library. All install into nvidia/cu<major>/.
PIP_COMPILER = ("nvidia-cuda-nvcc", "nvidia-nvvm", "nvidia-cuda-crt", "nvidia-cuda-cccl", "nvidia-cuda-runtime")


def _nvcc_release(nvcc):
    """The CUDA release of an nvcc ("13.0"), or None when it does not run."""
    import re
    import subprocess

    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"release (\d+\.\d+)", out)
    return found.group(1) if found else None


def _compiler_requirements(release):
    """The compiler's packages for a CUDA release: the versions that torch's own `cuda-toolkit` pins where it is
    installed (torch's CUDA libraries came from it), else the newest of that release."""
    pins = {}
    try:
        listed = importlib.metadata.requires("cuda-toolkit") or []
    except importlib.metadata.PackageNotFoundError:
        listed = []
    for requirement in listed:
        name, _, version = requirement.split(";")[0].partition("==")
        if name.strip() in PIP_COMPILER and version.strip().startswith(release + "."):
            pins[name.strip()] = version.strip()
    return [f"{name}=={pins.get(name, release + '.*')}" for name in PIP_COMPILER]


def _pip_cuda_home(torch):
    """A CUDA_HOME made of the package index's compiler for torch's CUDA release, for a machine with no toolkit.

    Returns (CUDA_HOME, where nvcc comes from), or (None, why not). The packages go into build/cuda-<release> of this
    source tree (not into the environment), once; the compiler must be the release torch was built with.
    """
    import subprocess

    release = torch.version.cuda
    major = int(release.split(".")[0])
    if major < 13:
        return None, (f"no CUDA toolkit found, and the package index has no CUDA {major} compiler (torch "
                      f"{torch.__version__} is built with CUDA {release}): install the CUDA {release} toolkit, set "
                      "CUDA_HOME to it and install lucid-assign again (pip install --no-build-isolation "
                      "--force-reinstall --no-deps lucid-assign)")
    folder = os.path.join(ROOT, "build", f"cuda-{release}")
    home = os.path.join(folder, "nvidia", f"cu{major}")
    if _nvcc_release(os.path.join(home, "bin", "nvcc")) != release:
        wanted = _compiler_requirements(release)
        print(f"lucid-assign: no CUDA toolkit found; installing the CUDA {release} compiler from the package index "
              f"into {folder}: {' '.join(wanted)}", flush=True)
        partial = folder + ".partial"
        shutil.rmtree(partial, ignore_errors=True)
        # pip's isolated build hides the environment's site-packages through PYTHONPATH; this pip runs without it
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE")}
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile",
                               "--disable-pip-version-check", "-q", "--target", partial, *wanted],
                              env=env, capture_output=True, text=True)
        if done.returncode != 0:
            return None, (f"no CUDA toolkit found, and pip could not install the CUDA {release} compiler "
                          f"({' '.join(wanted)}): {(done.stderr.strip().splitlines() or ['?'])[-1]}")
        shutil.rmtree(folder, ignore_errors=True)
        os.rename(partial, folder)
        if _nvcc_release(os.path.join(home, "bin", "nvcc")) != release:
            return None, f"the CUDA {release} compiler installed into {folder} does not run"
    lib = os.path.join(home, "lib")
    # the runtime ships as libcudart.so.<major>; the extension links with -lcudart (and nvcc looks in lib64)
    if not os.path.lexists(os.path.join(lib, "libcudart.so")):
        os.symlink(f"libcudart.so.{major}", os.path.join(lib, "libcudart.so"))
    if not os.path.lexists(os.path.join(home, "lib64")):
        os.symlink("lib", os.path.join(home, "lib64"))
    nvcc = next(importlib.metadata.distributions(name="nvidia-cuda-nvcc", path=[folder]), None)
    version = nvcc.version if nvcc else release
    return home, f"nvcc {version} of pip's nvidia-cuda-nvcc (no CUDA toolkit found) in {folder}"


def _find_compiler(torch, with_cuda, why):
    """CUDA_HOME for the build: a toolkit, or else the package index's compiler. Returns (with_cuda, why, compiler),
    compiler saying where nvcc came from; stops when FORCE_CUDA=1 and there is none."""
    if not with_cuda:
        return False, why, None
    if os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH"):
        home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
        return True, why, f"nvcc {_nvcc_release(os.path.join(home, 'bin', 'nvcc'))} of the toolkit at {home}"
    nvcc = shutil.which("nvcc")
    if nvcc:  # a toolkit elsewhere (conda's, say): torch takes CUDA_HOME from where its nvcc is
        return True, why, f"nvcc {_nvcc_release(nvcc)} on PATH ({nvcc})"
    home, compiler = _pip_cuda_home(torch)
    if home is None:
        if os.environ.get("FORCE_CUDA") == "1":
            _stop(f"FORCE_CUDA=1 but {compiler}")
        return False, compiler, None
    os.environ["CUDA_HOME"] = home  # read by torch.utils.cpp_extension when it is imported, below
    return True, why, compiler


def _missing_cuda_headers_dir(cuda_home):
    """ATen's CUDA headers include cuSPARSE/cuBLAS/cuSOLVER headers that an nvcc-only toolkit may lack.

    pip's CUDA build of torch brings them in the `nvidia/cu13` (or cu12) package. Rather than putting that whole
    folder ahead of the toolkit (its cuda_runtime.h could shadow the toolkit's), link only the headers the toolkit
    lacks into a folder of our own and add that folder to the include path.
    """
    toolkit_inc = os.path.join(cuda_home, "include")
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
        _stop(
            "the CUDA toolkit at %s has no cusparse.h, which ATen's CUDA headers need, and no pip package "
            "`nvidia-*` provides it: install the toolkit's math libraries or torch's CUDA wheels" % cuda_home
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
        shim = _missing_cuda_headers_dir(cuda_home)
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
        _default_cuda_home()
        torch = _import_torch()
        with_cuda, why, compiler = _find_compiler(torch, *_want_cuda(torch))
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
