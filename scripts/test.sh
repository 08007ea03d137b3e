#!/usr/bin/env bash
# Installs everything (see setup.sh), then runs every check: Rust format,
# lints and tests, Python lints, the type-stub check, and the Python tests.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh test
export VIRTUAL_ENV="$PWD/.venv" PATH="$PWD/.venv/bin:$PATH" PYO3_PYTHON="$PWD/.venv/bin/python"

echo "==> cargo fmt --check"
cargo fmt --check
echo "==> cargo clippy -- -D warnings"
cargo clippy --all-features --all-targets -- -D warnings
echo "==> cargo test (with decode_video's FFmpeg code)"
cargo test --features video
echo "==> ruff"
ruff check .
ruff format --check .
echo "==> stubtest"
# From elsewhere, so that the installed package (stubs and extension) is checked.
(cd / && python -m mypy.stubtest minato._minato)
echo "==> pytest"
# The `pytest` script, not `python -m pytest`: the installed wheel is what
# gets tested, not the source folder minato/ (which lacks the extension).
pytest
echo "==> pytest again with worker processes: parity, resume, Lightning"
# (The reordering suite coordinates its datasets with threading events, and
# Lightning's seeding tests read what worker threads recorded in the parent's
# dataset: thread-only by design; tests/test_process_workers.py has their
# process counterparts.)
MINATO_TEST_WORKER_METHOD=multiprocessing pytest -q tests/test_equivalence.py \
    tests/test_resume.py tests/test_lightning.py -k "not seed_everything_workers"
