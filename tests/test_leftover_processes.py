"""The run's mark reaches every process the tests start, even one orphaned under a killed parent,
so that the run's end finds it (tests/leftover_processes.py)."""

from __future__ import annotations

import subprocess
import sys
import time

from .leftover_processes import leftovers


def test_an_orphaned_grandchild_is_found_by_the_runs_mark() -> None:
    # the child starts a sleeping grandchild, prints its pid and exits: the grandchild is orphaned
    # (its output goes elsewhere: one that kept the pipe would hold `run` as it would hold CI)
    script = (
        "import subprocess, sys; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
        "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
        "print(p.pid)"
    )
    child = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30
    )
    orphan = int(child.stdout.strip())
    try:
        assert orphan in leftovers()
    finally:
        subprocess.run(["kill", "-9", str(orphan)], check=False)
    deadline = time.monotonic() + 5
    while orphan in leftovers() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert orphan not in leftovers()
