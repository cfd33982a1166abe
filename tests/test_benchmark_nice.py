"""The capacity benchmark's harness at a niceness of its own (benchmarks/loadtest.py `niced`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from loadtest import niced  # noqa: E402

NICENESS = [sys.executable, "-c", "import os; print(os.nice(0))"]  # prints the process's own


def _niceness(command: list[str]) -> int:
    return int(subprocess.run(command, capture_output=True, text=True, check=True).stdout)


def test_the_harness_runs_at_the_niceness_asked_above_its_parents() -> None:
    ours = os.nice(0)
    assert _niceness(niced(NICENESS, 19)) == min(19, ours + 19)
    assert _niceness(niced(NICENESS, 5)) == min(19, ours + 5)


def test_niceness_zero_leaves_the_command_as_it_is() -> None:
    assert niced(NICENESS, 0) == NICENESS
    assert _niceness(niced(NICENESS, 0)) == os.nice(0)
