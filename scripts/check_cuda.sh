#!/usr/bin/env bash
# The checks of a change to the CUDA kernels, on any machine with an NVIDIA GPU, the CUDA toolkit (nvcc and
# compute-sanitizer on PATH) and a CUDA build of torch in the active Python environment:
#   build     compile the extension in place against that torch (TORCH_CUDA_ARCH_LIST: by default the visible GPU's)
#   test      the test suite, CUDA tests included; a library that does not load fails instead of skipping
#   sanitize  compute-sanitizer: memcheck over the CUDA tests marked for it, racecheck and initcheck over
#             scripts/sanitize_assign.py (the compiled op alone), racecheck over the matching's subset
#   bench     the benchmark (OBB at 10 to 2,000 objects per image, HBB at 100, pose and seg at 20 and 100, the dense
#             presets; with the peer when it is installed) and the per-kernel profile (bench/profile_cuda.py)
# Usage: bash scripts/check_cuda.sh [STAGE...] (default: all four, in that order; it stops at the first failure).
# Logs and JSON go to $OUT (default: cuda-check/ in the repository); PYTEST_ARGS go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
OUT="${OUT:-cuda-check}"
mkdir -p "$OUT"
STAGES=("$@")
[ ${#STAGES[@]} -gt 0 ] || STAGES=(build test sanitize bench)
export PYTHONUNBUFFERED=1 LUCID_REQUIRE_EXT=1
if [ -z "${TORCH_CUDA_ARCH_LIST:-}" ]; then
  TORCH_CUDA_ARCH_LIST=$("$PY" -c "import torch; print('%d.%d' % torch.cuda.get_device_capability())")
  export TORCH_CUDA_ARCH_LIST
fi

sanitize() {  # tool, a name for its log, then the command; the tool's summary line and its exit status
  local tool=$1 log="$OUT/sanitizer_$2.log" status=0
  shift 2
  timeout "${SANITIZE_TIMEOUT:-600}" compute-sanitizer --tool "$tool" --error-exitcode 9 "$@" >"$log" 2>&1 || status=$?
  echo "compute-sanitizer $tool: exit $status | $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tr '\n' ' ')"
  return $status
}

for stage in "${STAGES[@]}"; do
  echo "== $stage"
  case "$stage" in
    build)
      nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
      "$PY" -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda)"
      echo "TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST"
      FORCE_CUDA=1 "$PY" setup.py build_ext --inplace >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
      "$PY" -m lucid_assign doctor >"$OUT/doctor.txt" 2>&1 || { cat "$OUT/doctor.txt"; exit 1; }
      grep -E "^(lucid-assign|compiled library|built with|ops with a CUDA)" "$OUT/doctor.txt"
      ;;
    test)
      # shellcheck disable=SC2086
      "$PY" -m pytest tests -q -rs -p no:cacheprovider ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/pytest.log" | tail -15
      ;;
    sanitize)
      sanitize memcheck memcheck "$PY" -m pytest tests/test_cuda.py tests/test_seg.py tests/test_lsap.py -k sanitize \
        -q -p no:cacheprovider
      sanitize racecheck racecheck "$PY" scripts/sanitize_assign.py
      sanitize racecheck racecheck_matching "$PY" -m pytest tests/test_lsap.py -k sanitize -q -p no:cacheprovider
      sanitize initcheck initcheck "$PY" scripts/sanitize_assign.py
      ;;
    bench)
      "$PY" -m lucid_assign bench --kind obb --batch 16 --objects 10 50 200 1000 2000 --device cuda --no-progress \
        --out "$OUT/bench_obb.json" 2>&1 | tail -12
      "$PY" -m lucid_assign bench --kind hbb --batch 16 --objects 100 --device cuda --no-progress \
        --out "$OUT/bench_hbb.json" 2>&1 | tail -4
      "$PY" -m lucid_assign bench --kind pose --batch 16 --objects 20 100 --device cuda --no-progress \
        --out "$OUT/bench_pose.json" 2>&1 | tail -7
      "$PY" -m lucid_assign bench --kind seg --batch 16 --objects 20 100 --device cuda --no-progress \
        --out "$OUT/bench_seg.json" 2>&1 | tail -7
      for preset in dense-obb xview; do
        "$PY" -m lucid_assign bench --preset "$preset" --device cuda --backends kernel,peer --no-progress \
          --out "$OUT/bench_$preset.json" 2>&1 | tail -4
      done
      "$PY" bench/profile_cuda.py 2>&1 | tee "$OUT/profile.txt"
      ;;
    *)
      echo "unknown stage: $stage (build, test, sanitize, bench)" >&2
      exit 2
      ;;
  esac
done
