#!/usr/bin/env bash
# A second device call on the lent H200: build, the whole suite, the benchmarks side by side with the peer, and the
# training acceptance runs of the peer's yolo26n-obb (bit-identical training with the patch; step time with and
# without it). Logs and JSON land in $OUT (at most 8 files come back). Usage: bash scripts/h200_full.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
export OUT
bash scripts/gpu_check.sh -x 2>&1 | tail -3 || exit 1
export PYTHONPATH=/tmp/site LUCID_REQUIRE_EXT=1 LUCID_REQUIRE_PEER=1 PYTHONUNBUFFERED=1
python3 -m lucid_assign bench --kind obb --batch 16 --objects 10 50 200 1000 2000 --device cuda --no-progress \
  --out "$OUT/bench_obb_h200.json" --plot "$OUT/bench_obb_h200.png" 2>&1 | tail -12 | tee "$OUT/bench.txt"
python3 -m lucid_assign bench --kind hbb --batch 16 --objects 100 --device cuda --no-progress \
  --out "$OUT/bench_hbb_h200.json" 2>&1 | tail -4 | tee -a "$OUT/bench.txt"
python3 bench/train_identical.py --steps 50 --objects 60 2>&1 | grep -v Overriding | tee "$OUT/train.txt"
python3 bench/train_step.py --objects 60 300 --steps 20 --warmup 5 2>&1 | grep -v Overriding | tee -a "$OUT/train.txt"
