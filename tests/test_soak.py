"""A shortened run of benchmarks/soak.py (the long one is the script's
default, 30 minutes): its scenarios deliver what they should, and RSS,
threads, memory maps and child processes stay flat."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)

SOAK = Path(__file__).resolve().parent.parent / "benchmarks" / "soak.py"


def test_a_short_soak_passes(tmp_path: Path) -> None:
    # Its own process, so that the figures are the soak's alone. sys.path
    # starts at benchmarks/, not the checkout: the installed minato is used.
    out = tmp_path / "soak.json"
    command = [sys.executable, str(SOAK), "--minutes", "0.5", "--report-every", "2"]
    run = subprocess.run(
        [*command, "--seed", "1", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-6000:]
    report = json.loads(out.read_text())
    assert report["passed"]
    assert set(report["scenarios"]) >= {
        "full_epochs",
        "break_then_epoch",
        "exceptions",
        "resume",
        "iterable",
    }
    assert sum(row["phase"] == "soak" for row in report["rows"]) >= 3
