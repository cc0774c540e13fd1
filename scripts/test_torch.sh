#!/usr/bin/env bash
# The core tests against another torch: a copy of the tree in build/torch-VERSION/src, built there (CPU kernels) in an
# environment of its own with that torch and its torchvision, so that the tree's own build and .venv stay as they are.
#   bash scripts/test_torch.sh 2.4.0                     # the core tests (CORE below)
#   bash scripts/test_torch.sh 2.15.0 tests/test_pose.py # other tests
# A pip configuration that caps torch (a constraints file) is lifted for this environment's installs only.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION="${1:?usage: scripts/test_torch.sh TORCH_VERSION [pytest arguments]}"
shift
# ops, dispatch, parity with the reference and with the peer on the CPU, one patched training step per task kind, the
# linear sum assignment against SciPy and the patched RT-DETR loss
CORE=(tests/test_assign_ops.py tests/test_points_in_boxes.py tests/test_dispatch.py tests/test_reference_vs_peer.py
      tests/test_assign_random.py tests/test_integration_ultralytics.py tests/test_lsap.py tests/test_rtdetr.py
      -k "not identical_with_and_without")
[ $# -gt 0 ] || set -- "${CORE[@]}"
# torchvision 0.(minor + 15) goes with torch 2.minor (the peer imports it)
MINOR=$(echo "$VERSION" | cut -d. -f2)
DIR="build/torch-$VERSION"
rm -rf "$DIR/src"
mkdir -p "$DIR/src"
# the files a fresh clone would have, as they are in this tree (a tracked file deleted here is left out)
git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
  if [ -f "$f" ]; then cp --parents "$f" "$DIR/src"; fi
done
export PIP_CONSTRAINT=/dev/null FORCE_CUDA="${FORCE_CUDA:-0}"
TORCH_REQS="torch==$VERSION"
PEER=()
VISION="torchvision==0.$((MINOR + 15)).*"
if python3 -m pip download -q --no-deps -d "$DIR/probe" "$VISION" >/dev/null 2>&1; then
  TORCH_REQS+=" $VISION"
  PEER=("ultralytics==8.4.190" "cloudpickle>=3.1.1")
else
  echo "test_torch.sh: the package index has no $VISION for torch $VERSION, so the peer (which imports torchvision)" \
       "is not installed and its tests skip"
  export LUCID_REQUIRE_PEER=0
fi
cd "$DIR/src"
LUCID_VENV="$OLDPWD/$DIR/venv" LUCID_TORCH="$TORCH_REQS" source scripts/_setup.sh pytest hypothesis scipy "${PEER[@]}"
python -m pytest -q -rs "$@"
