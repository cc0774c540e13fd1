#!/usr/bin/env bash
# The closing device call of a session: build; the CUDA tests (stop on failure); the training acceptance runs
# (bit-identical training with the patch, then step time with and without it); the profile; the benchmarks side by
# side with the peer. Outputs in $OUT. compute-sanitizer runs in its own call: bash scripts/h200_session.sh quick.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
export OUT
bash scripts/gpu_check.sh tests/test_cuda.py tests/test_cuda_rows.py tests/test_hardening.py tests/test_assign_ops.py \
  -x -k "cuda" || exit 1
grep -q " passed" "$OUT/pytest.log" && ! grep -qE " (failed|error)" "$OUT/pytest.log" || exit 1
export PYTHONPATH=/tmp/site LUCID_REQUIRE_EXT=1 LUCID_REQUIRE_PEER=1 PYTHONUNBUFFERED=1
python3 bench/train_identical.py --steps 50 --objects 60 2>&1 | grep -v Overriding | tee "$OUT/train.txt"
python3 bench/train_step.py --objects 60 300 --steps 16 --warmup 3 2>&1 | grep -v Overriding | tee -a "$OUT/train.txt"
python3 bench/profile_cuda.py 2>&1 | grep -v -i warn | tee "$OUT/profile.txt"
python3 -m lucid_assign bench --kind obb --batch 16 --objects 10 50 200 1000 2000 --device cuda --no-progress \
  --out "$OUT/bench_obb_h200.json" --plot "$OUT/bench_obb_h200.png" 2>&1 | tail -12 | tee "$OUT/bench.txt"
python3 -m lucid_assign bench --kind hbb --batch 16 --objects 100 --device cuda --no-progress \
  --out "$OUT/bench_hbb_h200.json" 2>&1 | tail -4 | tee -a "$OUT/bench.txt"
