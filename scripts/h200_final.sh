#!/usr/bin/env bash
# The last device call of a session when device time is short: build; the training acceptance runs (bit-identical
# training with the patch, then step time with and without it); the benchmarks side by side with the peer; then
# compute-sanitizer racecheck and initcheck over scripts/sanitize_assign.py (the compiled op alone). Outputs in $OUT.
# (The run of 2026-11-29 used this script's earlier form: racecheck over a pytest subset, initcheck filtered to our
# kernels, which cannot see what PyTorch's kernels wrote into our inputs.)
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
for tool in racecheck initcheck; do
  timeout 150 compute-sanitizer --tool "$tool" --error-exitcode 9 python3 scripts/sanitize_assign.py \
    >"$OUT/sanitizer_$tool.log" 2>&1
  echo "$tool: exit $? | $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|done' "$OUT/sanitizer_$tool.log" | tr '\n' ' ')"
done
