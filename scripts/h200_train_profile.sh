#!/usr/bin/env bash
# One device call: build, the training-step benchmark (which records the assigners' real inputs of one patched
# step), then the profile of those recorded calls and of the bench scene with YOLO26's second top-k (topk2 = 1).
# Usage: bash scripts/h200_train_profile.sh [objects...]   (default 60 300)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
export OUT
bash scripts/gpu_check.sh --build-only || exit 1
export PYTHONPATH=/tmp/site LUCID_REQUIRE_EXT=1 PYTHONUNBUFFERED=1
objects="${*:-60 300}"
# shellcheck disable=SC2086
python3 bench/train_step.py --objects $objects --steps 15 --warmup 3 --dump /tmp/calls 2>&1 | tee "$OUT/train_step.txt"
python3 bench/profile_cuda.py --inputs /tmp/calls-m*.pt 2>&1 | grep -v Warn | tee "$OUT/profile_train.txt"
python3 bench/profile_cuda.py --cases obb:16:200 --topk2 1 2>&1 | grep -v Warn | tee "$OUT/profile_topk2.txt"
