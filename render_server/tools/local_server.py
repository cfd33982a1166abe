"""`render-server serve` as a child process on a free loopback port, as a user runs it: what the
benchmarks and the end-to-end tests measure against."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class LocalServer:
    url: str
    process: subprocess.Popen[bytes]
    command: list[str]


@contextlib.contextmanager
def local_server(
    *args: str,
    log_path: Path,
    timeout: float = 120.0,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    launcher: Sequence[str] | None = None,
) -> Iterator[LocalServer]:
    """`render-server serve ARGS` on a free port, up once `/healthz` answers (its output in
    `log_path`); stopped (SIGTERM, then SIGKILL after 10 s) on leaving. `launcher` replaces
    `python -m render_server`, e.g. by a test's entry point that changes the server first."""
    port = free_port()
    start = list(launcher) if launcher is not None else [sys.executable, "-m", "render_server"]
    command = [*start, "serve", "--port", str(port), *args]
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, cwd=cwd,
            env={**os.environ, **(env or {})},
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + timeout
            while True:
                if process.poll() is not None:
                    raise RuntimeError(
                        f"server exited with {process.returncode}: {log_path.read_text()[-4000:]}"
                    )
                with contextlib.suppress(OSError):
                    with urllib.request.urlopen(url + "/healthz", timeout=1):
                        break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"server not up in {timeout}s: {log_path.read_text()}")
                time.sleep(0.2)
            yield LocalServer(url, process, command)
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
