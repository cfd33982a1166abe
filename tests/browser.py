"""Helpers for the browser tests: Debian's Chromium through Playwright, the server as a process."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
# The closed network refuses Chromium's background connections; these flags keep it quiet.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--autoplay-policy=no-user-gesture-required",
]


def chromium_path() -> str:
    path = os.environ.get("CHROMIUM_PATH") or next(
        (p for p in CHROMIUM_CANDIDATES if shutil.which(p)), None
    )
    if path is None:
        pytest.fail("no Chromium found: install Debian's chromium (CI does) or set CHROMIUM_PATH")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serve_process(
    *args: str, log_path: Path, timeout: float = 120.0, env: dict[str, str] | None = None
) -> Iterator[str]:
    """`render-server serve` on a free port, as a user runs it; yields its base URL."""
    port = free_port()
    command = [sys.executable, "-m", "render_server", "serve", "--port", str(port), *args]
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + timeout
            while True:
                if process.poll() is not None:
                    raise RuntimeError(
                        f"server exited with {process.returncode}: {log_path.read_text()}"
                    )
                try:
                    with urllib.request.urlopen(url + "/healthz", timeout=1):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        raise TimeoutError(
                            f"server not up in {timeout}s: {log_path.read_text()}"
                        ) from None
                    time.sleep(0.2)
            yield url
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
