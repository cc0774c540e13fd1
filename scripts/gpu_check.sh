#!/usr/bin/env bash
# On a GPU machine (the device tool's H200): build in place against that machine's torch, then run the test suite
# with the CUDA tests. Wheels in .whl/ (the peer ultralytics and the packages it lacks there) go to /tmp/site first.
# Extra arguments go to pytest; "--build-only" stops after the build. Logs land in $OUT (or /tmp/out).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" MAX_JOBS="${MAX_JOBS:-16}" PYTHONUNBUFFERED=1
export LUCID_REQUIRE_EXT=1 LUCID_REQUIRE_PEER=1
# The lent H200 image sets CXX=/opt/gcc/bin/g++, a wrapper whose builds crash (SIGSEGV) when the op throws a C++
# exception (seen 2026-11-29); the system compiler of the same version works.
if [ -x /usr/bin/g++ ]; then export CXX=/usr/bin/g++ CC=/usr/bin/gcc; fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda)"
if ! python3 setup.py build_ext --inplace >"$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"
  exit 1
fi
[ "${1:-}" = --build-only ] && exit 0
python3 -m pytest tests -q -rs -p no:cacheprovider "$@" 2>&1 | tee "$OUT/pytest.log" | tail -15
