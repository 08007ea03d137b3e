#!/usr/bin/env bash
# Builds minato's two wheels into dist/:
#   - the abi3 wheel (CPython >= 3.11 with the GIL), and
#   - the cp314t wheel for free-threaded CPython 3.14, where pyo3 cannot use
#     the stable ABI. maturin builds it from its bundled sysconfig: no 3.14t
#     interpreter is needed on this machine.
# Video decoding (FFmpeg) is included, as scripts/setup.sh builds it.
#
#   bash scripts/build_wheels.sh            # both
#   bash scripts/build_wheels.sh abi3       # one of them
#   bash scripts/build_wheels.sh cp314t
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
    bash scripts/setup.sh
fi
.venv/bin/python -m pip install -q "maturin>=1.9,<2"
features="python,video"
what="${1:-all}"
if [ "$what" = all ] || [ "$what" = abi3 ]; then
    .venv/bin/python -m maturin build --release --features "$features" --auditwheel skip --out dist
fi
if [ "$what" = all ] || [ "$what" = cp314t ]; then
    .venv/bin/python -m maturin build --release --features "$features" --auditwheel skip --out dist \
        --interpreter python3.14t
fi
ls -1 dist/*.whl
