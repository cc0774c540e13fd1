#!/usr/bin/env bash
# The main job: set up (or reuse) .venv, build, and assign a built-in DOTA-like batch. Extra arguments go to the demo
# (see: python -m lucid_assign demo --help).
set -euo pipefail
source "$(dirname "$0")/_setup.sh"
python -m lucid_assign demo "$@"
