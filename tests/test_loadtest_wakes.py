"""The harness's coalescing event loop: fewer wakes for its sockets, timers on time, and
arrivals still timed by the kernel."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

import pytest

from render_server.config import ConfigError
from render_server.tools.loadtest.config import LoadTestConfig
from render_server.tools.loadtest.wakes import CoalescingSelector, loop_factory
from render_server.transport.udp_gro import GroStats, ReadClock, read_coalesced


def _run(interval_s: float, main: Any) -> Any:
    with asyncio.Runner(loop_factory=loop_factory(interval_s)) as runner:
        return runner.run(main())


def _send_every(port: int, count: int, gap_s: float) -> threading.Thread:
    def send() -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            for _ in range(count):
                sock.sendto(b"x" * 100, ("127.0.0.1", port))
                time.sleep(gap_s)

    return threading.Thread(target=send, daemon=True)


async def _receive_batches(count: int, gap_s: float) -> tuple[list[float], Any]:
    """`count` datagrams sent `gap_s` apart from another thread, read as the harness reads
    (`read_coalesced`: the socket drained each wake): when each was read, and the selector."""
    loop = asyncio.get_running_loop()
    read_at: list[float] = []
    transport, _ = await loop.create_datagram_endpoint(
        asyncio.DatagramProtocol, local_addr=("127.0.0.1", 0)
    )
    try:
        got = lambda data, addr: read_at.append(time.monotonic())  # noqa: E731
        assert read_coalesced(transport, got, lambda exc: None, GroStats())
        sender = _send_every(transport.get_extra_info("sockname")[1], count, gap_s)
        sender.start()
        deadline = time.monotonic() + 10.0
        while len(read_at) < count and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        sender.join(timeout=5.0)
        return read_at, loop._selector  # type: ignore[attr-defined]
    finally:
        transport.close()


def _batches(read_at: list[float], apart_s: float) -> int:
    return 1 + sum(1 for a, b in zip(read_at, read_at[1:], strict=False) if b - a > apart_s)


def test_sockets_are_read_in_batches_no_closer_than_the_interval() -> None:
    read_at, selector = _run(0.05, lambda: _receive_batches(100, 0.003))
    assert len(read_at) == 100  # nothing lost: the kernel queued what came between wakes
    assert isinstance(selector, CoalescingSelector) and selector.sleeps > 0
    # 100 datagrams over ≥ 0.3 s, read in wakes ≥ 50 ms apart (the sleeps between polls of
    # the test's own 50 ms timer do not hold reads closer than that either)
    batches = _batches(read_at, 0.02)
    span = read_at[-1] - read_at[0]
    assert batches <= span / 0.05 + 2, (batches, span)
    assert batches < 30


def test_interval_zero_is_asyncios_own_loop() -> None:
    assert loop_factory(0.0) is None
    read_at, selector = _run(0.0, lambda: _receive_batches(20, 0.003))
    assert len(read_at) == 20
    assert not isinstance(selector, CoalescingSelector)


def test_a_timer_due_within_the_interval_fires_on_time() -> None:
    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        late: list[float] = []
        for _ in range(5):
            await asyncio.sleep(0)  # a wake: the selector's interval starts again
            due = loop.time() + 0.01
            fired = loop.create_future()
            loop.call_at(due, fired.set_result, None)
            await fired
            late.append(loop.time() - due)
        return late

    late = _run(0.5, main)  # a 500 ms interval, 10 ms timers
    assert max(late) < 0.25, late  # the timer's, not the interval's


def test_arrivals_keep_the_kernels_stamp_when_the_read_comes_later() -> None:
    async def main() -> list[tuple[float, float | None, float]]:
        loop = asyncio.get_running_loop()
        got: list[tuple[float, float | None, float]] = []  # sent, stamp, read (monotonic ms)
        sent: list[float] = []
        clock = ReadClock()
        transport, _ = await loop.create_datagram_endpoint(
            asyncio.DatagramProtocol, local_addr=("127.0.0.1", 0)
        )

        arrived = loop.create_future()

        def received(data: bytes, addr: Any) -> None:
            got.append((sent[len(got)], clock.kernel_ms, time.monotonic() * 1000.0))
            if not arrived.done():
                arrived.set_result(None)

        assert read_coalesced(transport, received, lambda e: None, GroStats(), clock=clock)
        port = transport.get_extra_info("sockname")[1]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            for _ in range(8):
                await asyncio.sleep(0.01)  # a wake, then 10 ms: the socket is held ~90 more
                sent.append(time.monotonic() * 1000.0)
                sock.sendto(b"y", ("127.0.0.1", port))
                while len(got) < len(sent):  # no timer: a timer's wake would read the socket
                    await arrived
                    arrived = loop.create_future()
        transport.close()
        return got

    got = _run(0.1, main)
    held = sorted(read - sent for sent, _, read in got)
    assert held[len(held) // 2] > 30.0, held  # the reads did wait for the interval
    # the kernel turns stamping on in deferred work: the first reads may come without
    stamped = sorted(stamp - sent for sent, stamp, _ in got if stamp is not None)
    if not stamped:
        pytest.skip("the kernel gave no receive stamps (SO_TIMESTAMPNS)")
    assert stamped[len(stamped) // 2] < 5.0, (stamped, held)


def test_the_interval_defaults_by_receiver_and_is_bounded() -> None:
    def config(**kw: Any) -> LoadTestConfig:
        return LoadTestConfig(server="http://127.0.0.1:1", **kw)

    assert config(receiver="count").wake_interval_s == 0.005
    assert config(receiver="lean").wake_interval_s == 0.0
    assert config(receiver="full").wake_interval_s == 0.0
    assert config(receiver="lean", wake_interval_ms=2).wake_interval_s == 0.002
    assert config(receiver="count", wake_interval_ms=0).wake_interval_s == 0.0
    assert config(receiver="count").as_dict()["wake_interval_ms"] == 5.0
    with pytest.raises(ConfigError, match="needs --receiver lean or count"):
        config(receiver="full", wake_interval_ms=5)
    assert config(receiver="full", wake_interval_ms=0).wake_interval_s == 0.0
    for bad in (-1.0, 51.0):
        with pytest.raises(ConfigError, match="--wake-interval-ms must be 0..50"):
            config(wake_interval_ms=bad)
