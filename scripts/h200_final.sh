#!/usr/bin/env bash
# The last device call of a session when device time is short: build; the training acceptance runs (bit-identical
# training with the patch, then step time with and without it); the benchmarks side by side with the peer; then
# compute-sanitizer racecheck on the sanitize subset and initcheck restricted to this project's kernels (PyTorch's
# own torch.topk, which the reference calls, reads memory it never wrote: not ours to fix). Outputs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
export OUT
bash scripts/gpu_check.sh tests/test_cuda.py -k "sanitize" 2>&1 | tail -2 || exit 1
export PYTHONPATH=/tmp/site LUCID_REQUIRE_EXT=1 LUCID_REQUIRE_PEER=1 PYTHONUNBUFFERED=1
python3 bench/train_identical.py --steps 50 --objects 60 2>&1 | grep -v Overriding | tee "$OUT/train.txt"
python3 bench/train_step.py --objects 60 300 --steps 15 --warmup 3 2>&1 | grep -v Overriding | tee -a "$OUT/train.txt"
python3 -m lucid_assign bench --kind obb --batch 16 --objects 10 50 200 1000 2000 --device cuda --no-progress \
  --out "$OUT/bench_obb_h200.json" --plot "$OUT/bench_obb_h200.png" 2>&1 | tail -12 | tee "$OUT/bench.txt"
python3 -m lucid_assign bench --kind hbb --batch 16 --objects 100 --device cuda --no-progress \
  --out "$OUT/bench_hbb_h200.json" 2>&1 | tail -4 | tee -a "$OUT/bench.txt"
timeout 100 compute-sanitizer --tool racecheck --error-exitcode 9 python3 -m pytest tests/test_cuda.py tests/test_cuda_rows.py \
  -k "sanitize or alternating" -q -p no:cacheprovider >"$OUT/sanitizer_racecheck.log" 2>&1
echo "racecheck: exit $? | $(grep -E 'RACECHECK SUMMARY|passed|failed' "$OUT/sanitizer_racecheck.log" | tr '\n' ' ')"
timeout 120 compute-sanitizer --tool initcheck --kernel-regex kns=lucid --error-exitcode 9 python3 -m pytest \
  tests/test_cuda.py tests/test_cuda_rows.py tests/test_hardening.py -q -p no:cacheprovider \
  -k "sanitize or (every_row_size and k10) or (more_candidates and near) or odd_inputs_same_on_every_backend_cuda" \
  >"$OUT/sanitizer_initcheck.log" 2>&1
echo "initcheck (lucid kernels): exit $? | $(grep -E 'ERROR SUMMARY|passed|failed' "$OUT/sanitizer_initcheck.log" | tr '\n' ' ')"
