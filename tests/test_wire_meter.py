"""What the sender hands over, per window: its rate, and the encoder's share of the wire (the
headers, the SRTP/UDP/IP overhead and the resends come off)."""

from __future__ import annotations

import pytest
from aiortc.rtcrtpparameters import RTCRtpHeaderExtensionParameters, RTCRtpParameters
from aiortc.rtp import RtpPacket

from render_server.transport.header_extensions import SenderExtensionsMap
from render_server.transport.wire_meter import FLOOR, MIN_PACKETS, PRIOR_SHARE, WireMeter

OVERHEAD = 38  # SRTP tag, UDP, IPv4: as the send path counts
WINDOW = 0.5


def packet(payload: int, extensions: SenderExtensionsMap | None = None, **kw: object) -> bytes:
    rtp = RtpPacket(payload_type=96, sequence_number=1, timestamp=1, ssrc=5,
                    payload=b"\x00" * payload)  # fmt: skip
    for name, value in kw.items():
        setattr(rtp.extensions, name, value)
    return rtp.serialize(extensions or SenderExtensionsMap())


def test_a_window_closes_only_once_its_time_has_passed() -> None:
    meter = WireMeter(0.0, WINDOW)
    meter.add([packet(1000)] * 50, OVERHEAD)
    meter.update(0.4)
    assert meter.rate is None and meter.share == PRIOR_SHARE
    meter.update(0.5)
    assert meter.rate == pytest.approx(50 * 1012 * 8 / 0.5)
    meter.add([packet(1000)] * 25, OVERHEAD)
    meter.update(1.0)  # half the rate: the smoothed rate moves half way
    assert meter.rate == pytest.approx(0.75 * 50 * 1012 * 8 / 0.5)


def test_too_few_packets_leave_the_share_as_it_was() -> None:
    meter = WireMeter(0.0, WINDOW)
    meter.add([packet(1000)] * (MIN_PACKETS - 1), OVERHEAD)
    meter.update(WINDOW)
    assert meter.share == PRIOR_SHARE and meter.rate is not None


def test_a_measured_window_moves_the_share_half_way() -> None:
    meter = WireMeter(0.0, WINDOW)
    meter.add([packet(1150)] * 100, OVERHEAD)
    meter.update(WINDOW)
    measured = 1150 / (1150 + 12 + OVERHEAD)
    assert meter.share == pytest.approx(0.5 * (PRIOR_SHARE + measured))
    for i in range(2, 22):
        meter.add([packet(1150)] * 100, OVERHEAD)
        meter.update(i * WINDOW)
    assert meter.share == pytest.approx(measured, abs=1e-4)


def test_the_first_packets_extensions_count_once_and_the_rest_by_the_last() -> None:
    extensions = SenderExtensionsMap()
    extensions.configure(RTCRtpParameters(headerExtensions=[RTCRtpHeaderExtensionParameters(
        id=3, uri="http://www.webrtc.org/experiments/rtp-hdrext/abs-send-time")]))  # fmt: skip
    first, rest = packet(1000, extensions, abs_send_time=1234), packet(1000)
    assert len(first) > len(rest)
    meter = WireMeter(0.0, WINDOW)
    meter.add([first] + [rest] * 29, OVERHEAD)
    assert meter._payload == 30 * 1000  # what the encoder made, every header off
    assert meter._wire == len(first) + 29 * len(rest) + 30 * OVERHEAD


def test_resends_are_wire_without_payload_and_the_share_keeps_a_floor() -> None:
    meter = WireMeter(0.0, WINDOW)
    meter.add([packet(1150)] * 50, OVERHEAD)
    for _ in range(25):
        meter.add([packet(1150)], OVERHEAD, repeat=True)  # one packet in three sent again
    meter.update(WINDOW)
    third_resent = 50 * 1150 / (75 * (1162 + OVERHEAD))
    assert meter.share == pytest.approx(0.5 * (PRIOR_SHARE + third_resent))
    for i in range(2, 12):
        meter.add([packet(1150)] * 100, OVERHEAD, repeat=True)  # nothing but resends
        meter.update(i * WINDOW)
    assert meter.share == pytest.approx(FLOOR, abs=1e-3)


def test_nothing_handed_over_adds_nothing() -> None:
    meter = WireMeter(0.0, WINDOW)
    meter.add([], OVERHEAD)
    assert meter._wire == meter._packets == meter._rtp == 0
