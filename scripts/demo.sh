#!/usr/bin/env bash
# Installs everything (see setup.sh), then trains a small model with torch's
# DataLoader and with minato's and prints both epoch times.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
.venv/bin/python examples/demo.py "$@"
