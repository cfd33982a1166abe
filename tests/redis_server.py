"""A real `redis-server` on a free port in a temporary directory, for the tests.

Debian's `redis-server` package provides it (CI installs it). Without it the tests that need
Redis fail with that advice: a Redis test that silently skipped would prove nothing.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

BINARY = "redis-server"
INSTALL_ADVICE = (
    "redis-server is not installed: install Debian's redis-server "
    "(apt-get install redis-server); the Redis registry and bus tests need a real one"
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One redis-server process; `restart()` keeps the port (and loses the data)."""

    def __init__(self, binary: str | None = None) -> None:
        found = binary or shutil.which(BINARY)
        if found is None:
            pytest.fail(INSTALL_ADVICE, pytrace=False)
        self.binary = found
        self.port = _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._dir = tempfile.TemporaryDirectory(prefix="redis-test-")
        self._process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 10.0) -> None:
        args = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", self._dir.name,
            "--logfile", str(Path(self._dir.name) / "redis.log"),
        ]  # fmt: skip
        self._process = subprocess.Popen(args, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while not _ping(self.port):
            if self._process.poll() is not None:
                raise RuntimeError(
                    f"redis-server exited with {self._process.returncode}: {self.log}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server did not answer PING in {timeout_s} s: {self.log}")
            time.sleep(0.01)

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.send_signal(signal.SIGCONT)  # a paused one handles the SIGTERM
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def pause(self) -> None:
        """Stop the process (SIGSTOP) without closing anything: its port still accepts
        connections (into the backlog) and nothing answers, as a stalled host behaves."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Let a paused process run again (SIGCONT); it answers what waited meanwhile."""
        self._signal(signal.SIGCONT)

    def _signal(self, signum: signal.Signals) -> None:
        if self._process is None:
            raise RuntimeError("redis-server is not running")
        self._process.send_signal(signum)

    def cleanup(self) -> None:
        self.stop()
        self._dir.cleanup()

    @property
    def log(self) -> str:
        path = Path(self._dir.name) / "redis.log"
        return path.read_text()[-2000:] if path.exists() else "(no log)"


@contextlib.contextmanager
def running_redis() -> Iterator[RedisServer]:
    """Start a redis-server, yield it (`.url`, `.restart()`), stop it and remove its directory."""
    server = RedisServer()
    try:
        for attempt in range(3):
            try:
                server.start()
                break
            except RuntimeError:  # another process took the free port first: take another
                if attempt == 2:
                    raise
                server.port = _free_port()
                server.url = f"redis://127.0.0.1:{server.port}/0"
        yield server
    finally:
        server.cleanup()


def fresh_prefix() -> str:
    """A key prefix of one test's own: the tests share one redis-server (conftest's
    `redis_url`), and none sees another's keys or channels."""
    return f"t{uuid.uuid4().hex[:10]}"


@contextlib.contextmanager
def redis_server() -> Iterator[str]:
    """Start a redis-server, yield its URL, stop it."""
    with running_redis() as server:
        yield server.url
