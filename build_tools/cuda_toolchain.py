"""The CUDA toolchain of lucid-assign's build: whether to compile the CUDA kernels, and with which compiler.

setup.py asks ``find(torch, root)`` once: a CUDA toolkit (CUDA_HOME or CUDA_PATH, /usr/local/cuda, an nvcc on PATH),
else, with a torch built with CUDA 13 or later, the package index's compiler of torch's CUDA release installed into
``root/build/cuda-<release>``, else CPU kernels only with one line saying what to install; and
``missing_headers_dir(cuda_home, root)`` for a toolkit that lacks the math libraries' headers ATen includes.
Its functions are plain: tests/test_build.py calls them directly.
"""

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys


def stop(why):
    """End the build with one line that says why and what to do."""
    raise SystemExit(f"lucid-assign: {why}")


STANDARD_HOME = "/usr/local/cuda"  # where a toolkit usually is


def default_cuda_home():
    """Point CUDA_HOME at a standard toolkit before torch guesses it from the `nvcc` on PATH.

    torch takes the parent of the folder holding `nvcc`; a wrapper script in /usr/local/bin makes that /usr/local,
    which has no CUDA headers. A toolkit at /usr/local/cuda (or the real location of nvcc) is the better guess.
    """
    if os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH"):
        return
    candidates = [STANDARD_HOME]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    for home in candidates:
        if os.path.exists(os.path.join(home, "bin", "nvcc")) and os.path.exists(
                os.path.join(home, "include", "cuda_runtime.h")):
            os.environ["CUDA_HOME"] = home
            return


def want_cuda(torch):
    """Whether to compile the CUDA kernels, and why, before looking for a compiler."""
    force = os.environ.get("FORCE_CUDA", "")
    if force == "0":
        return False, "FORCE_CUDA=0"
    if torch.version.cuda is None:
        if force == "1":
            stop("FORCE_CUDA=1 but this torch has no CUDA support (torch %s)" % torch.__version__)
        return False, "torch %s has no CUDA support" % torch.__version__
    if force == "1":
        return True, "FORCE_CUDA=1"
    if torch.cuda.is_available():
        return True, "a GPU is visible"
    return False, "no GPU visible (set FORCE_CUDA=1 to build the CUDA kernels anyway)"


# The package index's CUDA compiler (CUDA 13 and later): nvcc with cudafe++, ptxas, fatbinary and nvlink; cicc; the
# compiler's own headers; CUB and Thrust; the runtime's headers and library. All install into nvidia/cu<major>/.
PIP_COMPILER = ("nvidia-cuda-nvcc", "nvidia-nvvm", "nvidia-cuda-crt", "nvidia-cuda-cccl", "nvidia-cuda-runtime")


def nvcc_release(nvcc):
    """The CUDA release of an nvcc ("13.0"), or None when it does not run."""
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"release (\d+\.\d+)", out)
    return found.group(1) if found else None


def compiler_requirements(release):
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


def pip_cuda_home(torch, root):
    """A CUDA_HOME made of the package index's compiler for torch's CUDA release, for a machine with no toolkit.

    Returns (CUDA_HOME, where nvcc comes from), or (None, why not). The packages go into build/cuda-<release> of this
    source tree (not into the environment), once; the compiler must be the release torch was built with.
    """
    release = torch.version.cuda
    major = int(release.split(".")[0])
    if major < 13:
        return None, (f"no CUDA toolkit found, and the package index has no CUDA {major} compiler (torch "
                      f"{torch.__version__} is built with CUDA {release}): install the CUDA {release} toolkit, set "
                      "CUDA_HOME to it and install lucid-assign again (pip install --no-build-isolation "
                      "--force-reinstall --no-deps lucid-assign)")
    folder = os.path.join(root, "build", f"cuda-{release}")
    home = os.path.join(folder, "nvidia", f"cu{major}")
    if nvcc_release(os.path.join(home, "bin", "nvcc")) != release:
        wanted = compiler_requirements(release)
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
        if nvcc_release(os.path.join(home, "bin", "nvcc")) != release:
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


def find_compiler(torch, with_cuda, why, root):
    """CUDA_HOME for the build: a toolkit, or else the package index's compiler. Returns (with_cuda, why, compiler),
    compiler saying where nvcc came from; stops when FORCE_CUDA=1 and there is none."""
    if not with_cuda:
        return False, why, None
    if os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH"):
        home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
        return True, why, f"nvcc {nvcc_release(os.path.join(home, 'bin', 'nvcc'))} of the toolkit at {home}"
    nvcc = shutil.which("nvcc")
    if nvcc:  # a toolkit elsewhere (conda's, say): torch takes CUDA_HOME from where its nvcc is
        return True, why, f"nvcc {nvcc_release(nvcc)} on PATH ({nvcc})"
    home, compiler = pip_cuda_home(torch, root)
    if home is None:
        if os.environ.get("FORCE_CUDA") == "1":
            stop(f"FORCE_CUDA=1 but {compiler}")
        return False, compiler, None
    os.environ["CUDA_HOME"] = home  # read by torch.utils.cpp_extension when it is imported, below
    return True, why, compiler


def missing_headers_dir(cuda_home, root):
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
        stop(
            "the CUDA toolkit at %s has no cusparse.h, which ATen's CUDA headers need, and no pip package "
            "`nvidia-*` provides it: install the toolkit's math libraries or torch's CUDA wheels" % cuda_home
        )
    shim = os.path.join(root, "build", "lucid_cuda_include")
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


def find(torch, root):
    """(with_cuda, why, compiler) for a build against ``torch`` of the source tree at ``root``: whether to compile the
    CUDA kernels, why (or why not), and where nvcc comes from (None without CUDA). Sets CUDA_HOME where it chose a
    toolkit or the package index's compiler; stops the build where FORCE_CUDA=1 cannot be honoured."""
    default_cuda_home()
    return find_compiler(torch, *want_cuda(torch), root)
