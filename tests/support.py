"""Shared helpers of the tests."""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

import aiohttp
import av
from aiohttp.test_utils import TestServer
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from render_server.protocol.timing import TimingRecord
from render_server.tools.measure.frames import ObservedFrame

ServerFactory = Callable[..., Awaitable[TestServer]]
T = TypeVar("T")


def ws_url(server: TestServer) -> str:
    return str(server.make_url("/ws")).replace("http://", "ws://")


async def receive(ws: aiohttp.ClientWebSocketResponse, timeout: float = 10.0) -> dict[str, Any]:
    """The next message on a signaling or worker socket: a JSON text frame, nothing else."""
    msg = await ws.receive(timeout=timeout)
    assert msg.type == aiohttp.WSMsgType.TEXT, (msg, ws.close_code)
    doc: dict[str, Any] = json.loads(msg.data)
    return doc


# -- waiting for what a test cannot time --------------------------------------------------------


Said = str | Callable[[], str]  # what a timeout says; a callable is asked when it is due


def _timed_out(timeout: float, what: Said, predicate: object) -> AssertionError:
    said = what() if callable(what) else what
    return AssertionError(f"not within {timeout:g} s: {said or predicate}")


def eventually(
    predicate: Callable[[], T | None],
    timeout: float = 10.0,
    every: float = 0.05,
    what: Said = "",
) -> T:
    """Call `predicate` every `every` seconds until it returns a true value, and return that
    value; AssertionError if it has not by `timeout` seconds (time.monotonic; the last call
    comes after the deadline, however late the machine wakes). For what takes as long as the
    machine makes it take (a loaded 2-core CI machine: seconds), instead of a sleep that hopes
    or a count of tries."""
    deadline = time.monotonic() + timeout
    while True:
        late = time.monotonic() >= deadline  # so that the last look comes after the deadline
        value = predicate()
        if value:
            return value
        if late:
            raise _timed_out(timeout, what, predicate)
        time.sleep(every)


@overload
async def eventually_async(
    predicate: Callable[[], Awaitable[T | None]],
    timeout: float = ...,
    every: float = ...,
    what: Said = ...,
) -> T: ...


@overload
async def eventually_async(
    predicate: Callable[[], T | None],
    timeout: float = ...,
    every: float = ...,
    what: Said = ...,
) -> T: ...


async def eventually_async(
    predicate: Callable[[], Any],
    timeout: float = 10.0,
    every: float = 0.05,
    what: Said = "",
) -> Any:
    """`eventually` on an event loop: `predicate` may be a coroutine function, and the loop
    runs while it waits."""
    deadline = time.monotonic() + timeout
    while True:
        late = time.monotonic() >= deadline
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if late:
            raise _timed_out(timeout, what, predicate)
        await asyncio.sleep(every)


class PacketTrack(MediaStreamTrack):
    """Hands aiortc pre-encoded packets (pts and time base set) at 30 fps, then ends: the
    sender's pre-encoded path only packetizes them."""

    kind = "video"

    def __init__(self, packets: list[av.Packet[Any]]) -> None:
        super().__init__()
        self.packets = list(packets)

    async def recv(self) -> av.Packet[Any]:  # type: ignore[override]
        await asyncio.sleep(1 / 30)
        if not self.packets:
            self.stop()
            raise MediaStreamError
        return self.packets.pop(0)


# -- measurement records ------------------------------------------------------------------------


def observed_frame(rtp: int, last_ms: float = 0.0, complete: bool = True) -> ObservedFrame:
    """A frame as the measuring client saw it arrive (`last_ms`: its last packet in)."""
    return ObservedFrame(rtp, last_ms - 1, last_ms, 500, 2, 0 if complete else 1, False, complete)


def timing_record(rtp: int, start_ms: float = 0.0) -> TimingRecord:
    """A frame's timing record as a worker sends it, its stages 1 ms apart from `start_ms`."""
    return TimingRecord(rtp, -1, None, start_ms, start_ms + 1, start_ms + 2, start_ms + 2,
                        start_ms + 3, 100, False)  # fmt: skip


def fleet_figures(metrics_text: str) -> dict[str, int]:
    """The fleet's figures as a replica's /metrics says them now (read from the registry on
    each scrape; /healthz answers from its last background read, which may lag)."""
    names = {"scheduler_workers": "workers", "worker_slots": "slots", "worker_slots_free": "free"}
    figures: dict[str, int] = {}
    for line in metrics_text.splitlines():
        name, _, value = line.partition(" ")
        if name in names:
            figures[names[name]] = int(float(value))
    return figures
