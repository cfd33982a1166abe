"""Real `render-server` processes for the scale-out tests: signaling replicas and workers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from render_server.signaling.auth import Authenticator

from .browser import free_port

SECRET = "test-secret-that-is-long-enough-for-hs256"
AUTH = Authenticator({"default": SECRET.encode()})


def token(role: str, subject: str | None = None, ttl_s: float = 3600) -> str:
    return AUTH.mint(role, subject, ttl_s)  # type: ignore[arg-type]


@dataclass
class Process:
    name: str
    process: subprocess.Popen[bytes]
    log: Path
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"

    def kill(self, sig: int = signal.SIGKILL) -> None:
        self.process.send_signal(sig)

    def tail(self) -> str:
        return self.log.read_text()[-3000:] if self.log.exists() else ""


def environment(with_secret: bool = True) -> dict[str, str]:
    """This process's environment for a `render-server` child: with the tests' signing key, or
    without any RENDER_SERVER_* variable (the child then holds only what its arguments give)."""
    if with_secret:
        return {**os.environ, "RENDER_SERVER_SECRET": SECRET}
    return {k: v for k, v in os.environ.items() if not k.startswith("RENDER_SERVER_")}


def run(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`python -m render_server ARGS` run to its end, its output captured as text; `env`: the
    child's whole environment (default: this process's)."""
    return subprocess.run(
        [sys.executable, "-m", "render_server", *args],
        capture_output=True, text=True, timeout=timeout,
        env=None if env is None else dict(env),
    )  # fmt: skip


def _spawn(name: str, args: list[str], log_dir: Path, with_secret: bool = True) -> Process:
    log = log_dir / f"{name}.log"
    env = {**environment(with_secret), "PYTHONUNBUFFERED": "1"}
    with open(log, "ab") as out:  # a process restarted under its name appends
        process = subprocess.Popen(
            [sys.executable, "-m", "render_server", *args], stdout=out, stderr=subprocess.STDOUT,
            env=env,
        )  # fmt: skip
    return Process(name, process, log)


def start_signaling(
    name: str, registry: str | None, log_dir: Path, *extra: str, port: int | None = None
) -> Process:
    """A replica on `port` (a free one unless given: a replica restarted where it was)."""
    port = port or free_port()
    args = ["signaling", "--host", "127.0.0.1", "--port", str(port), "--heartbeat-timeout", "3"]
    if registry:
        args += ["--registry", registry]
    proc = _spawn(name, args + list(extra), log_dir)
    proc.port = port
    deadline = time.monotonic() + 60
    while True:
        if proc.process.poll() is not None:
            raise RuntimeError(f"{name} exited: {proc.tail()}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(proc.url + "/readyz", timeout=1):
                return proc
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name} not ready: {proc.tail()}")
        time.sleep(0.1)


def start_worker(
    name: str,
    replica: Process,
    log_dir: Path,
    slots: int = 2,
    *extra: str,
    with_secret: bool = True,
) -> Process:
    """A worker of `replica`. Without the secret it cannot mint a token of its own: only what
    `extra` gives it (`--token-file`) can authenticate it."""
    args = [
        "worker", "--signaling", f"ws://127.0.0.1:{replica.port}/worker", "--worker-id", name,
        "--slots", str(slots), "--resolution", "64x64", "--fps", "5", "--renderer", "cpu",
        "--encoder", "x264", "--connect-timeout", "300",
        "--drain-timeout", "2",  # stopped at a test's end: not the 100 s a real pod gets
    ]  # fmt: skip
    return _spawn(name, args + list(extra), log_dir, with_secret)


def workers(replica: Process) -> list[dict[str, Any]]:
    request = urllib.request.Request(
        replica.url + "/api/workers", headers={"Authorization": f"Bearer {token('viewer')}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return list(json.load(response)["workers"])
    except urllib.error.HTTPError as exc:
        exc.msg = f"{exc.msg}: {exc.read()[:300]!r}; {replica.name}'s log: {replica.tail()}"
        raise


def _registered(replica: Process) -> int:
    """How many workers `replica` lists; -1 while its shared state answers 503 (a Redis
    stalled for a socket timeout on a loaded machine: asked again, as a script would)."""
    try:
        return len(workers(replica))
    except urllib.error.HTTPError as exc:
        if exc.code == 503:
            return -1
        raise


def wait_for_workers(
    replica: Process, count: int, procs: list[Process], timeout: float = 60
) -> None:
    deadline = time.monotonic() + timeout
    while _registered(replica) < count:
        for proc in procs:
            if proc.process.poll() is not None:
                raise RuntimeError(f"{proc.name} exited: {proc.tail()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(workers(replica))} of {count} workers registered")
        time.sleep(0.1)


@contextlib.contextmanager
def stopping(*procs: Process) -> Iterator[None]:
    try:
        yield
    finally:
        for proc in procs:
            if proc.process.poll() is None:
                proc.process.terminate()
        for proc in procs:
            try:
                proc.process.wait(10)
            except subprocess.TimeoutExpired:
                proc.process.kill()


class SignalClient:
    """A browser's signaling socket, without media: enough to test placement."""

    def __init__(self, url: str, token: str | None) -> None:
        self.url = url
        self.token = token
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.seen: list[dict[str, Any]] = []
        self._http: aiohttp.ClientSession | None = None
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self._reader: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        self._http = aiohttp.ClientSession()
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self.ws = await self._http.ws_connect(self.url, headers=headers)
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def send(self, **message: Any) -> None:
        assert self.ws is not None
        await self.ws.send_str(json.dumps({"v": 1, **message}))

    async def next(self, *types: str, timeout: float = 15) -> dict[str, Any]:
        """The next message (of one of `types`, skipping others)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            left = deadline - asyncio.get_running_loop().time()
            message = await asyncio.wait_for(self.inbox.get(), max(left, 0.001))
            if not types or message.get("type") in types:
                return message

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        if self.ws is not None:
            await self.ws.close()
        if self._http is not None:
            await self._http.close()

    async def _read(self) -> None:
        assert self.ws is not None
        async for msg in self.ws:
            if msg.type == aiohttp.WSMsgType.TEXT:
                message = json.loads(msg.data)
                self.seen.append(message)
                self.inbox.put_nowait(message)
