"""Processes a test run leaves behind, found and stopped when the run ends.

Every process the tests start inherits `RUN_MARK` through its environment (servers, workers and
their children, redis, coturn, browsers), including one a test lost track of, or one whose parent
was killed under it. A survivor keeps the run's output pipe open, so whoever reads that pipe (CI)
waits for it forever after pytest itself has exited; the run's last hook ends them, and names them
so that the leak is seen and mended.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

RUN_MARK = "RENDER_TESTS_RUN"  # not RENDER_SERVER_*: some tests strip those


def mark_this_run() -> None:
    """Mark this run (a worker of pytest-xdist: its own part of it). Each xdist worker inherits
    the controller's mark and ends its leftovers when it finishes: a worker done early would
    otherwise stop the servers and browsers of tests still running on the others."""
    run = os.environ.setdefault(RUN_MARK, uuid.uuid4().hex)
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker and not run.endswith(f"-{worker}"):
        os.environ[RUN_MARK] = f"{run}-{worker}"


def _marked(pid: int, needle: bytes) -> bool:
    try:
        return needle in (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:  # gone, or not ours to read
        return False


def _command(pid: int) -> str:
    try:
        raw = (Path("/proc") / str(pid) / "cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:160]


def leftovers() -> list[int]:
    """The live processes of this run other than this one."""
    mark = os.environ.get(RUN_MARK)
    if not mark:
        return []
    needle = f"{RUN_MARK}={mark}".encode()
    me = os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != me and _marked(int(entry.name), needle):
            found.append(int(entry.name))
    return found


def stop_leftovers(grace_s: float = 3.0) -> list[str]:
    """SIGTERM each leftover, SIGKILL what is still there after `grace_s`; their command lines."""
    pids = leftovers()
    named = [f"{pid}: {_command(pid)}" for pid in pids]
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while pids and time.monotonic() < deadline:
        time.sleep(0.1)
        pids = [pid for pid in pids if _alive(pid)]
    for pid in pids:
        _signal(pid, signal.SIGKILL)
    return named


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:
        pass


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
