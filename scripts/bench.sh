#!/usr/bin/env bash
# The main job: set up (or reuse) .venv, build, and run `lucid-assign bench` on a built-in DOTA-like batch: what the
# assigner did, and each backend's time and memory side by side. Extra arguments go to the bench
# (see: lucid-assign bench --help), e.g. `bash scripts/bench.sh --objects 10 50 200 --plot bench.png`.
set -euo pipefail
source "$(dirname "$0")/_setup.sh" matplotlib
lucid-assign bench "$@"
