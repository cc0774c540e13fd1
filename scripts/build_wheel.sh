#!/usr/bin/env bash
# Build the sdist and a binary wheel for the torch of the active Python environment, into dist/ (or $1).
#
# The wheel's version says what it was built for, e.g. lucid_assign-0.2.0+pt214cu130-cp310-abi3-linux_x86_64.whl:
# torch 2.14 with CUDA 13.0 kernels (or +pt214cpu without them), one file for every CPython >= 3.10, requiring that
# torch minor. The CUDA kernels are compiled for TORCH_CUDA_ARCH_LIST, by default the architectures the toolkit
# supports from Turing on, plus PTX of the newest so that later GPUs can compile it at load time.
#   PYTHON=python3.11 bash scripts/build_wheel.sh             # the torch of that interpreter
#   TORCH_CUDA_ARCH_LIST="8.0;9.0+PTX" bash scripts/build_wheel.sh dist
#   FORCE_CUDA=0 bash scripts/build_wheel.sh                  # a CPU-only wheel
# The environment needs torch, setuptools>=64, wheel, ninja and build (nothing is fetched).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
OUT="${1:-dist}"
mkdir -p "$OUT"
if [ -z "${TORCH_CUDA_ARCH_LIST:-}" ]; then
  # Turing (7.5) to Blackwell (12.0) where the toolkit of this torch has them; CUDA 12 before 12.8 stops at Hopper
  TORCH_CUDA_ARCH_LIST=$("$PY" -c "
import torch
cuda = tuple(int(x) for x in (torch.version.cuda or '0.0').split('.')[:2])
archs = ['7.5', '8.0', '8.6', '8.9', '9.0'] + (['10.0', '12.0'] if cuda >= (12, 8) else [])
print(';'.join(archs[:-1] + [archs[-1] + '+PTX']))")
  export TORCH_CUDA_ARCH_LIST
fi
# the sdist holds every source whatever this machine can compile (MANIFEST.in); packing it needs no torch
"$PY" -m build --sdist --no-isolation --outdir "$OUT" .
export FORCE_CUDA="${FORCE_CUDA:-1}" LUCID_LOCAL_VERSION=1
echo "lucid-assign wheel: torch $("$PY" -c 'import torch; print(torch.__version__)'), FORCE_CUDA=$FORCE_CUDA," \
     "TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST"
rm -rf build/lib* build/temp*  # never reuse objects compiled for another torch or architecture list
# setup.py records the build in lucid_assign/_build_info.py: keep the record of an in-place build of this tree
INFO=lucid_assign/_build_info.py
if [ -f "$INFO" ]; then cp "$INFO" "$INFO.keep"; trap 'mv -f "$INFO.keep" "$INFO"' EXIT; fi
"$PY" -m pip wheel --no-build-isolation --no-deps --wheel-dir "$OUT" .
"$PY" - "$OUT" <<'EOF'
import glob, os, sys, zipfile
wheel = max(glob.glob(os.path.join(sys.argv[1], "lucid_assign-*.whl")), key=os.path.getmtime)
print("\nbuilt", wheel)
for name in sorted(zipfile.ZipFile(wheel).namelist()):
    print("  ", name)
EOF
