# Sourced by scripts/bench.sh and scripts/test.sh: create or reuse a virtual environment, install torch and the
# package (compiled in place, so that the source tree imports the built library), and activate the environment.
#   LUCID_VENV      the environment's folder (default .venv in the repository)
#   LUCID_TORCH     the torch requirement(s), separated by spaces (default torch==2.14.1)
#   PYTHON          the interpreter that creates the environment (default python3)
# Build knobs (FORCE_CUDA, TORCH_CUDA_ARCH_LIST, MAX_JOBS, CUDA_HOME, DEBUG) pass through to setup.py.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV="${LUCID_VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  "${PYTHON:-python3}" -m venv "$VENV"
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"
python -m pip install -q --upgrade pip >/dev/null
read -ra TORCH_REQUIREMENTS <<< "${LUCID_TORCH:-torch==2.14.1}"
python -m pip install -q "${TORCH_REQUIREMENTS[@]}" numpy pybind11 ninja "setuptools>=77" wheel "$@"
# --no-build-isolation: the extension must be compiled against the torch installed above (see setup.py).
python -m pip install -q --no-build-isolation -e .
python -c "import lucid_assign, torch; from lucid_assign import _library; b = lucid_assign.backends(); print('lucid-assign built: torch', torch.__version__, '| library loaded:', b['library'], '| CPU ops:', b['cpu_ops'], '| CUDA ops:', b['cuda_ops'], '| GPU visible:', b['cuda_device'], '| CUDA compiler:', (_library.BUILD or {}).get('compiler'))"
