#!/usr/bin/env bash
# One device call on the lent H200: build, CUDA tests first (stop on failure), then the whole suite,
# compute-sanitizer (memcheck, racecheck, initcheck) over a representative subset, and the benchmarks side by side with the peer.
# Logs, JSON and plots land in $OUT. Usage: bash scripts/h200_session.sh [quick]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
export OUT
# build + CUDA-marked tests (stop at the first failure: device time is short)
bash scripts/gpu_check.sh tests/test_cuda.py tests/test_cuda_rows.py tests/test_hardening.py tests/test_assign_ops.py -x -k "cuda" || exit 1
grep -q " passed" "$OUT/pytest.log" && ! grep -q " failed" "$OUT/pytest.log" || exit 1
export PYTHONPATH=/tmp/site LUCID_REQUIRE_EXT=1 LUCID_REQUIRE_PEER=1 PYTHONUNBUFFERED=1
# compute-sanitizer: memcheck over a pytest subset (the kernel against the reference), racecheck and initcheck over
# scripts/sanitize_assign.py (the compiled op alone: the reference's torch.topk reads memory it never wrote, and its
# kernels make racecheck slow)
SANITIZE_FILES="${SANITIZE_FILES:-tests/test_cuda.py}"  # memcheck's pytest files, and a -k expression
SANITIZE_K="${SANITIZE_K:-sanitize}"
# shellcheck disable=SC2086
timeout "${SANITIZE_TIMEOUT:-300}" compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest \
  $SANITIZE_FILES -k "$SANITIZE_K" -q -p no:cacheprovider >"$OUT/sanitizer_memcheck.log" 2>&1
echo "compute-sanitizer memcheck: exit $? | $(grep -E 'ERROR SUMMARY|passed|failed' "$OUT/sanitizer_memcheck.log" | tr '\n' ' ')"
for tool in racecheck initcheck; do
  timeout "${SANITIZE_TIMEOUT:-300}" compute-sanitizer --tool "$tool" --error-exitcode 9 python3 \
    scripts/sanitize_assign.py >"$OUT/sanitizer_$tool.log" 2>&1
  echo "compute-sanitizer $tool: exit $? | $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|done' "$OUT/sanitizer_$tool.log" | tr '\n' ' ')"
  grep -m 5 -E "Error|Race|hazard|Uninitialized|at .*assign_cuda" "$OUT/sanitizer_$tool.log" | cut -c1-200
done
python3 bench/profile_cuda.py 2>&1 | tee "$OUT/profile.txt"
[ "${1:-}" = quick ] && exit 0
python3 -m pytest tests -q -p no:cacheprovider 2>&1 | tail -3 | tee "$OUT/pytest_all.log"
python3 -m lucid_assign bench --kind obb --batch 16 --objects 10 50 200 1000 2000 --device cuda --no-progress \
  --out "$OUT/bench_obb_h200.json" --plot "$OUT/bench_obb_h200.png" 2>&1 | tail -18 | tee "$OUT/bench_obb.txt"
python3 -m lucid_assign bench --kind hbb --batch 16 --objects 100 --device cuda --no-progress \
  --out "$OUT/bench_hbb_h200.json" 2>&1 | tail -5 | tee "$OUT/bench_hbb.txt"
