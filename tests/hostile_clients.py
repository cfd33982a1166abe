"""Hostile clients of one real `render-server serve`, and what each edge must answer them.

The clients run on an event loop of their own thread (`BackgroundLoop`), so that hypothesis
drives them from the test's thread while a legitimate stream keeps flowing. For every message
the expected answer comes from the protocol's own parsers (sans-IO): a message they refuse
must be answered at once with an `error` of their code; one they take is followed by a probe
whose answer marks the end of whatever the first one provoked.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

from render_server.protocol.data_channel import (
    CommandError,
    InputError,
    PingRequest,
    QualityRequest,
    SceneCommand,
    parse_message,
)
from render_server.protocol.errors import ErrorCode, ProtocolError
from render_server.signaling.app import WS_TRANSPORT_LIMIT
from render_server.tools.local_server import local_server
from render_server.tools.viewer import Viewer

from .hostile_messages import Frame, Request

T = TypeVar("T")
ROOT = Path(__file__).resolve().parent.parent
KNOWN_CODES = frozenset(v for k, v in vars(ErrorCode).items() if k.isupper()) - {"internal"}
DC_CODES = frozenset(
    {"too_large", "bad_json", "bad_input", "unknown_type", "rate_limited", "forbidden",
     "unknown_command", "bad_command"}
)  # fmt: skip
BROWSER_SOCKET_NEWS = frozenset(
    {"session.started", "queue", "session.interrupted", "session.ended", "answer", "error"}
)
WORKER_SOCKET_NEWS = frozenset(
    {"session.open", "offer", "ice", "session.close", "worker.registered", "error"}
)
# errors a session sends of its own accord (the worker's, relayed), besides any message's answer
SESSION_ERRORS = frozenset(
    {"no_capacity", "worker_failed", "offer_timeout", "bad_offer", "unknown_session",
     "bad_message"}
)  # fmt: skip
WS_CLOSE_TOO_BIG, WS_CLOSE_NOT_UTF8, WS_CLOSE_POLICY = 1009, 1007, 1008
MAX_VIOLATIONS = 100  # README: rejected messages before a socket is closed (1008)
ANSWER_S = 10.0  # the longest any answer may take, on a loaded 2-core machine


class BackgroundLoop:
    """An event loop in a thread of its own; `run` waits for a coroutine from another thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 120.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


# -- the server ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Served:
    url: str
    pid: int
    log: Path

    def ws(self, path: str = "/ws") -> str:
        return self.url.replace("http://", "ws://") + path

    def rss_kib(self) -> int:
        """The server process's resident memory, from /proc."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError("no VmRSS")

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@contextlib.contextmanager
def serve(log: Path, fps: float, slots: int = 8) -> Iterator[Served]:
    """`render-server serve` with a small CPU stream that moves on its own (every frame is a new
    picture: the configured frame rate, not the idle one). On loopback: no tokens."""
    args = [
        "--resolution", "320x180", "--max-resolution", "320x180", "--fps", str(fps),
        "--renderer", "cpu", "--encoder", "x264", "--slots", str(slots), "--animate",
        "--resume-grace", "1",
    ]  # fmt: skip
    # the server fixes glibc's mmap threshold itself (cli/process.py): RSS then shows a leak
    with local_server(*args, log_path=log, cwd=ROOT, timeout=120) as server:
        yield Served(server.url, server.process.pid, log)


# -- streams ---------------------------------------------------------------------------------------


class CountingViewer(Viewer):
    """A viewer whose decoded frames are counted as they come."""

    def __init__(self, url: str) -> None:
        super().__init__(url, frame_queue=256)
        self.count = 0
        self.arrivals: list[float] = []  # when each frame came (monotonic), for the gaps
        self._counter: asyncio.Task[None] | None = None
        self._probes = 0

    async def start(self, timeout: float = 30.0) -> dict[str, Any]:
        info = await super().start(timeout)
        self._counter = asyncio.get_running_loop().create_task(self._count())
        return info

    async def _count(self) -> None:
        while True:
            await self.frames.get()
            self.count += 1
            self.arrivals.append(time.monotonic())

    def longest_gap(self, since: float) -> float:
        """The longest time without a frame from `since` to now (seconds)."""
        times = [since, *(t for t in self.arrivals if t > since), time.monotonic()]
        return max(b - a for a, b in zip(times, times[1:], strict=False))

    async def more_frames(self, count: int = 1, timeout: float = 20.0) -> None:
        """Until `count` more frames have come."""
        target = self.count + count
        deadline = time.monotonic() + timeout
        while self.count < target:
            assert time.monotonic() < deadline, f"{target - self.count} frames missing"
            await asyncio.sleep(0.05)

    async def ping(self, timeout: float = ANSWER_S) -> dict[str, Any]:
        """A `ping` on the data channel and its `pong`."""
        self._probes += 1
        probe = 2**40 + self._probes
        start = len(self.messages)
        await self.send_input({"type": "ping", "id": probe, "t": 1.0})
        return await self.wait_message("pong", start=start, timeout=timeout, id=probe)

    async def close(self) -> None:
        if self._counter is not None:
            self._counter.cancel()
        await super().close()

    @property
    def session_id(self) -> str:
        return str(self.session_info.get("sessionId", ""))


def send_text_bytes(viewer: Viewer, data: bytes) -> None:
    """A text message (PPID 51) of any bytes, UTF-8 or not: what `RTCDataChannel.send` cannot
    make (it encodes a str). Through aiortc 1.16's private send queue, as `send` does."""
    channel = viewer.input
    transport = channel.transport
    channel._addBufferedAmount(len(data))
    transport._data_channel_queue.append((channel, 51, data))
    asyncio.ensure_future(transport._data_channel_flush())


# -- the data channel ------------------------------------------------------------------------------


@dataclass(frozen=True)
class DcExpect:
    code: str | None  # refused with this code
    event: Any = None  # else the parsed event


def expect_dc(frame: Frame) -> DcExpect:
    try:
        event, _ = parse_message(frame.data)
    except CommandError as exc:
        return DcExpect(exc.code)
    except InputError as exc:
        return DcExpect(exc.code)
    return DcExpect(None, event)


async def dc_exchange(viewer: CountingViewer, frame: Frame, stats: Counter[str]) -> None:
    """Send `frame` on the viewer's data channel, then a ping; check what came in between."""
    expect = expect_dc(frame)
    stats[f"dc sent {frame.how.split()[0]}"] += 1
    start = len(viewer.messages)
    if frame.kind == "raw_text":
        assert isinstance(frame.data, bytes)
        send_text_bytes(viewer, frame.data)
    else:
        viewer.input.send(frame.data)
    pong = await viewer.ping()
    end = next(i for i in range(start, len(viewer.messages)) if viewer.messages[i] is pong)
    # timing records and the paced path's network figures come on their own, any time
    replies = [m for m in viewer.messages[start:end] if m.get("type") not in ("timing", "network")]
    codes = [m.get("code") for m in replies if m.get("type") == "error"]
    assert "internal" not in codes, (frame, replies)
    assert all(code in DC_CODES for code in codes), (frame, replies)
    if codes == ["rate_limited"]:
        stats["dc rate_limited"] += 1
        return
    event = expect.event
    if expect.code is not None:
        assert codes == [expect.code], (frame, expect, replies)
        stats[f"dc {expect.code}"] += 1
        return
    kinds = [m.get("type") for m in replies]
    if isinstance(event, PingRequest):
        assert any(m.get("type") == "pong" and m.get("id") == event.id for m in replies), replies
    elif isinstance(event, QualityRequest):
        assert "quality" in kinds, (frame, replies)
    elif isinstance(event, SceneCommand):
        answers = [m for m in replies if m.get("type") in ("result", "error")]
        assert len(answers) == 1, (frame, replies)
        assert answers[0]["type"] == "result" or answers[0]["code"] in (
            "bad_command", "unknown_command", "forbidden",
        ), (frame, replies)  # fmt: skip
    else:
        assert not codes, (frame, replies)
    assert set(kinds) <= {"quality", "pong", "result", "error"}, (frame, replies)
    stats[f"dc {type(event).__name__}"] += 1


# -- the sockets -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Expect:
    close: int | None = None  # the server closes the socket with this code
    code: str | None = None  # else an `error` with this code answers at once
    # neither: a message the parsers take; whatever it does, a probe follows it


def expect_socket(frame: Frame, parse: Callable[[str], object]) -> Expect:
    if frame.size >= WS_TRANSPORT_LIMIT:
        return Expect(close=WS_CLOSE_TOO_BIG)  # aiohttp refuses a frame of the limit or more
    if frame.kind == "binary":
        return Expect(code=ErrorCode.BAD_MESSAGE)
    data = frame.data
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError:
            return Expect(close=WS_CLOSE_NOT_UTF8)  # RFC 6455 §8.1: fail the connection
    try:
        parse(data)
    except ProtocolError as exc:
        return Expect(code=exc.code)
    return Expect()


class TokenPacer:
    """Sends no faster than the server's bucket refills, so that messages are parsed, not
    refused as `rate_limited` (which is answered, and fine, but tests nothing)."""

    def __init__(self, rate_per_s: float, burst: int) -> None:
        self.rate, self.burst = rate_per_s, burst
        self.tokens = float(burst)
        self.at = time.monotonic()

    async def take(self) -> None:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1:
            await asyncio.sleep((1 - self.tokens) / self.rate)
            self.tokens, self.at = 1.0, time.monotonic()
        self.tokens -= 1


class SocketClosed(Exception):
    pass


class HostileSocket:
    """One hostile client's socket (`/ws` or `/worker`): sends a frame, reads its answer, and
    reconnects after the closes the server documents (1009, 1007, and 1008 after
    MAX_VIOLATIONS refusals)."""

    def __init__(
        self,
        http: aiohttp.ClientSession,
        url: str,
        parse: Callable[[str], object],
        news: frozenset[str],
        *,
        pacer: TokenPacer | None,
        max_violations: int | None,
        register: Callable[[int], dict[str, Any]] | None = None,
    ) -> None:
        self.http = http
        self.url = url
        self.parse = parse
        self.news = news
        self.pacer = pacer
        self.max_violations = max_violations
        self.register = register
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.errors = 0  # error messages on this connection
        self.connections = 0
        self.probes = 0
        self.stats: Counter[str] = Counter()

    async def exchange(self, frame: Frame) -> None:
        expect = expect_socket(frame, self.parse)
        self.stats[f"sent {frame.how.split()[0]}"] += 1
        for _ in range(2):  # once more on a fresh socket if the last one was closed for policy
            await self._ensure_open()
            try:
                await self._send(frame)
                await self._answered(frame, expect)
                return
            except SocketClosed:
                self._closed_for_policy(frame)
        raise AssertionError(f"{frame} was never answered")

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()
            self.ws = None

    # -- internals -------------------------------------------------------------------------

    async def _ensure_open(self) -> None:
        if self.ws is not None and not self.ws.closed:
            return
        self.ws = await self.http.ws_connect(self.url, max_msg_size=WS_TRANSPORT_LIMIT * 4)
        self.errors = 0
        self.connections += 1
        if self.register is not None:
            await self.ws.send_str(json.dumps(self.register(self.connections)))
            while (await self._next(frame=None))["type"] != "worker.registered":
                pass  # a request for a session placed here may come first

    async def _send(self, frame: Frame) -> None:
        assert self.ws is not None
        if frame.kind != "binary" and self.pacer is not None:
            await self.pacer.take()
        try:
            if frame.kind == "binary":
                assert isinstance(frame.data, bytes)
                await self.ws.send_bytes(frame.data)
            elif frame.kind == "raw_text":
                assert isinstance(frame.data, bytes)
                await self.ws._writer.send_frame(frame.data, aiohttp.WSMsgType.TEXT)
            else:
                assert isinstance(frame.data, str)
                await self.ws.send_str(frame.data)
        except ConnectionError:
            raise SocketClosed from None

    async def _next(self, frame: Frame | None) -> dict[str, Any]:
        """The next message; SocketClosed when the server closed the socket instead."""
        assert self.ws is not None
        try:
            msg = await self.ws.receive(timeout=ANSWER_S)
        except TimeoutError:
            raise AssertionError(f"no answer in {ANSWER_S} s to {frame}") from None
        if msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING,
                        aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):  # fmt: skip
            raise SocketClosed
        assert msg.type == aiohttp.WSMsgType.TEXT, (frame, msg)
        doc = json.loads(msg.data)
        assert isinstance(doc, dict) and doc.get("type") in self.news, (frame, doc)
        if doc["type"] == "error":
            self.errors += 1
            assert doc.get("code") in KNOWN_CODES, (frame, doc)  # never `internal`
            assert isinstance(doc.get("message"), str), (frame, doc)
        return doc

    async def _answered(self, frame: Frame, expect: Expect) -> None:
        if expect.close is not None:
            with contextlib.suppress(SocketClosed):
                while True:  # news of a session may come first
                    await self._next(frame)
            assert self.ws is not None
            code = self.ws.close_code
            assert code == expect.close, (frame, expect, code)
            self.ws = None
            self.stats[f"closed {code}"] += 1
            return
        if expect.code is not None:
            while True:
                doc = await self._next(frame)
                if doc["type"] != "error":
                    continue  # news of a session
                if doc["code"] in (expect.code, "rate_limited"):
                    self.stats[doc["code"]] += 1
                    return
                assert doc["code"] in SESSION_ERRORS, (frame, expect, doc)
        # taken by the parser: what it provoked ends where the probe's answer comes
        self.stats["taken"] += 1
        marker = await self._probe(frame)
        while True:
            doc = await self._next(frame)
            if doc["type"] == "error" and marker in doc["message"]:
                return
            if doc["type"] == "error" and doc["code"] == "rate_limited":
                marker = await self._probe(frame)  # that probe was not read: another one

    async def _probe(self, frame: Frame) -> str:
        self.probes += 1
        kind = f"hostile.probe.{self.probes}"
        await self._send(Frame(json.dumps({"v": 1, "type": kind}), "text", "probe"))
        return repr(kind)

    def _closed_for_policy(self, frame: Frame) -> None:
        """The server closed the socket: only for too many refusals."""
        assert self.ws is not None
        code, errors = self.ws.close_code, self.errors
        assert self.max_violations is not None, (frame, "closed", code)
        assert code == WS_CLOSE_POLICY and errors >= self.max_violations, (frame, code, errors)
        self.stats["closed 1008"] += 1
        self.ws = None


# -- REST ------------------------------------------------------------------------------------------

OUR_ROUTES = {
    ("POST", "/api/sessions"),
    ("GET", "/api/sessions/{id}"),
    ("DELETE", "/api/sessions/{id}"),
    ("GET", "/api/workers"),
}


def route_of(request: Request) -> tuple[str, str]:
    path = request.path
    tail = path.removeprefix("/api/sessions/")
    if tail != path and len(tail) == 32 and all(c in "0123456789abcdef" for c in tail):
        path = "/api/sessions/{id}"
    return request.method, path


async def rest_exchange(
    http: aiohttp.ClientSession, base: str, request: Request, stats: Counter[str]
) -> None:
    """Never a server error; an error from our own routes is a JSON document with `code` and
    `message` (whatever the status: the HTTP layer's rules are changing, these are not)."""
    headers = {"Content-Type": request.content_type} if request.content_type else {}
    async with http.request(
        request.method, base + request.path, data=request.body, headers=headers,
        skip_auto_headers=() if request.content_type else ("Content-Type",),
    ) as response:  # fmt: skip
        body = await response.read()
        status = response.status
    stats[f"rest {status}"] += 1
    # 503 is a refusal the API documents (no worker can meet the requirements), with its code
    deliberate = status == 503 and json.loads(body).get("code") in KNOWN_CODES
    assert status < 500 or deliberate, (request, status, body[:300])
    if status >= 400 and route_of(request) in OUR_ROUTES:
        doc = json.loads(body)
        assert isinstance(doc.get("code"), str) and isinstance(doc.get("message"), str), (
            request, status, doc,
        )  # fmt: skip


async def gather_all(*coros: Awaitable[None]) -> None:
    """Run side by side; the first failure is raised once all have ended."""
    results = await asyncio.gather(*coros, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
