#!/usr/bin/env bash
# Runs the Python tests against the oldest torch minato supports (2.11, what
# the GPU machines run), in a virtualenv of its own, .venv-torch-floor, with
# the torchvision, torchdata and lightning that pip resolves for it. CI stays
# on the newest torch (scripts/test.sh); run this by hand when touching what
# minato takes from torch. Needs what scripts/setup.sh installs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

floor="${TORCH_FLOOR:-2.11.*}"
if [ ! -x .venv-torch-floor/bin/python ]; then
    python3 -m venv .venv-torch-floor
fi
export VIRTUAL_ENV="$PWD/.venv-torch-floor" PATH="$PWD/.venv-torch-floor/bin:$PATH"
python -m pip install -q --upgrade pip
echo "==> pip install torch==$floor and minato[test]"
# torch pinned in the same command, so that pip picks the test tools for it.
MATURIN_PEP517_ARGS="--features python,video" python -m pip install -q "torch==$floor" ".[test]"
(cd / && python -c 'import torch, minato; print(f"minato {minato.__version__} on torch {torch.__version__}")')
echo "==> pytest"
pytest
