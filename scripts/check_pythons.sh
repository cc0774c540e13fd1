#!/usr/bin/env bash
# The one abi3 wheel on several CPython versions: for each interpreter, a fresh environment (build/python-check) with
# torch==TORCH and lucid-assign from the find-links page in DIR (scripts/build_wheel.sh), then `lucid-assign doctor`
# and one assignment with the kernel against the reference.
#   bash scripts/check_pythons.sh dist 2.14.1 "python3.10 python3.11 python3.12 python3.13"
# A pip configuration that caps torch (a constraints file) is lifted for these installs.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="$(cd "${1:?usage: scripts/check_pythons.sh DIR TORCH [PYTHONS]}" && pwd)"
TORCH="${2:?the torch version to install, e.g. 2.14.1}"
PYTHONS="${3:-python3.10 python3.11 python3.12 python3.13}"
export PIP_CONSTRAINT=/dev/null
status=0
for py in $PYTHONS; do
  env="build/python-check/$(basename "$py")"
  rm -rf "$env"
  "$py" -m venv "$env"
  "$env/bin/python" -m pip install -q "torch==$TORCH" lucid-assign --find-links "$DIR/index.html"
  if (cd "$env" && bin/lucid-assign doctor > doctor.txt && bin/python - <<'EOF'
import platform, torch, lucid_assign
from lucid_assign.synthetic import dota_like_batch
b = dota_like_batch(batch=2, img_size=256, num_classes=5, objects=(5, 20), obb=True, seed=0)
x = [b[k] for k in ("pd_scores", "pd_bboxes", "anc_points", "gt_labels", "gt_bboxes", "mask_gt")]
kw = dict(topk=10, num_classes=5, alpha=0.5, beta=6.0)
got = lucid_assign.assign(*x, backend="kernel", **kw)
want = lucid_assign.assign(*x, backend="reference", **kw)
ok = all(torch.equal(a != 0, w != 0) if a.is_floating_point() else torch.equal(a, w) for a, w in zip(got, want))
ok &= torch.allclose(got[2], want[2], rtol=1e-6, atol=0)
print(f"Python {platform.python_version()}, torch {torch.__version__}, lucid-assign", lucid_assign.__version__,
      "assignment:", "kernel = reference" if ok else "DIFFERS")
assert ok
EOF
  ); then
    echo "PASS $py ($(grep -m1 'all checks passed' "$env/doctor.txt" || echo 'doctor: see doctor.txt'))"
  else
    echo "FAIL $py (see $env)"
    status=1
  fi
done
exit $status
