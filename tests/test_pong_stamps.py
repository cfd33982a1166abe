"""Pongs timed by their datagram's kernel receive stamp: the load test's clock alignment does not
widen by the time its loop took to read them (a busy loop, or wakes held together)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aiortc import RTCPeerConnection

from render_server.tools.measure.clock import ClockOffset
from render_server.tools.measure.matching import FrameMatcher
from render_server.transport.counting_receiver import CountingReceiver
from render_server.transport.lean_receiver import LeanReceiver

from .receivers import h264_receiver
from .test_counting_receiver import _datagram, _keyed

RECEIVER_REPORT = bytes([0x80, 201, 0, 1]) + b"\0" * 4


def _pong(clock: ClockOffset, sent: float, worker: float) -> dict[str, Any]:
    ping = clock.ping(sent)
    return {"type": "pong", "id": ping["id"], "w": worker}


@pytest.mark.parametrize(
    ("stamped", "taken"),
    [
        (103.0, 103.0),  # between the ping and the read: the stamp
        (None, 110.0),  # no stamp: the read
        (99.0, 110.0),  # before the ping left (a stepped clock): the read
        (111.0, 110.0),  # after the read: the read
    ],
)
def test_a_pong_takes_its_stamp_where_the_stamp_can_be_true(
    stamped: float | None, taken: float
) -> None:
    clock = ClockOffset()
    assert clock.pong(_pong(clock, 100.0, 101.0), 110.0, stamped)
    assert clock.samples[-1].received_ms == taken


def test_the_matcher_hands_the_stamp_to_the_clock() -> None:
    matcher = FrameMatcher()
    pong = _pong(matcher.clock, 0.0, 1.0)  # sent at 0 ms: any stamp since is after it
    assert matcher.receive(json.dumps(pong), arrived_ms=2.0) is None
    assert matcher.clock.samples[-1].received_ms == 2.0
    # the truth is within [w − received, w − sent] = [-1, 1]: the stamp narrows it from 2+ ms
    assert matcher.clock.error_bound == pytest.approx(1.0)


def _readers(receiver: LeanReceiver, keyed: Any) -> tuple[Any, list[bytes]]:
    left: list[bytes] = []

    async def aiortcs(data: bytes, arrival_ms: int) -> None:
        pass

    # as `_hook_sockets` hands them aiortc's way in: through `_stamped`
    to_aiortc = receiver._stamped(lambda data, addr: left.append(data))
    read, _ = receiver._readers(keyed, to_aiortc, aiortcs)
    return read, left


@pytest.mark.parametrize("kind", ["count", "lean"])
async def test_what_goes_aiortcs_way_leaves_its_kernel_stamp(kind: str) -> None:
    pc = RTCPeerConnection()
    transceiver_receiver = h264_receiver(pc)
    receiver: LeanReceiver
    if kind == "count":
        receiver = CountingReceiver(transceiver_receiver, lambda *_: None)
    else:
        receiver = LeanReceiver(transceiver_receiver, lambda *_: None)
    read, left = _readers(receiver, _keyed())
    assert receiver.control_ms is None
    receiver.clock.kernel_ms = 5000.0  # the read under way, as `udp_gro.read_coalesced` sets it
    read(RECEIVER_REPORT, None)  # RTCP: aiortc's way (as DTLS, the data channel's, goes)
    assert left == [RECEIVER_REPORT] and receiver.control_ms == 5000.0
    if kind == "count":  # media counted here leaves it alone
        receiver.clock.kernel_ms = 5001.0
        read(_datagram(10, 3000, 1), None)
        assert receiver.control_ms == 5000.0
    receiver.clock.kernel_ms = None  # a read without a stamp: the next message is timed on reading
    read(RECEIVER_REPORT, None)
    assert receiver.control_ms is None
    await pc.close()
