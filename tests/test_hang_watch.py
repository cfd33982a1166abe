"""The run's watchdog (`hang_watch`): a test stuck in C, or an exit held by a thread, ends the
run with the stacks printed instead of hanging CI."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_pytest(tmp_path: Path, body: str, **env_extra: str) -> tuple[int, str, float]:
    (tmp_path / "test_stuck.py").write_text(textwrap.dedent(body))
    env = {**os.environ, "HANG_WATCH_MARGIN_S": "3", **env_extra}
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.hang_watch", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), str(tmp_path / "test_stuck.py")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return done.returncode, done.stdout + done.stderr, time.monotonic() - start


def test_a_test_stuck_in_c_ends_the_run_with_its_stack(tmp_path: Path) -> None:
    # pytest-timeout's alarm never arrives, as in C code that does not return to Python
    code, output, took = run_pytest(
        tmp_path,
        """
        import signal
        import time
        import pytest

        @pytest.mark.timeout(1)
        def test_stuck():
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
            time.sleep(40)
        """,
    )
    assert code == 1, output
    assert "hang-watch: test_stuck.py::test_stuck is stuck" in output
    assert "in test_stuck" in output.split("is stuck", 1)[1]  # the stack names where
    assert took < 30


def test_a_thread_holding_the_exit_ends_the_run(tmp_path: Path) -> None:
    code, output, took = run_pytest(
        tmp_path,
        """
        import threading

        def test_leaves_a_thread():
            threading.Thread(target=threading.Event().wait, name="never-ends").start()
        """,
    )
    assert code == 1, output
    assert "1 passed" in output
    assert "hang-watch: the interpreter's exit after the tests is stuck" in output
    assert took < 30


def test_a_test_stuck_in_an_await_shows_its_tasks_before_the_timeout(tmp_path: Path) -> None:
    """pytest-timeout's stacks show the loop idling; the task that waits, and where, is named."""
    code, output, took = run_pytest(
        tmp_path,
        """
        import asyncio
        import pytest

        async def waits_forever(event):
            await event.wait()

        async def main():
            await asyncio.get_running_loop().create_task(waits_forever(asyncio.Event()))

        @pytest.mark.timeout(4)
        def test_stuck():
            asyncio.run(main())
        """,
        HANG_WATCH_TASKS_BEFORE_S="2",
    )
    assert code == 1, output
    assert "Timeout" in output  # pytest-timeout's failure, with what the watchdog wrote
    tasks = output.split("is near its timeout; its event loops' tasks:", 1)[1]
    assert "waits_forever" in tasks and "await event.wait()" in tasks
    assert took < 30
