"""The lean receiver: RTP read straight from the decrypted datagram. Its header parsing on real
aiortc packets, and a real run whose counts match what the worker's /metrics says it sent."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiortc import RTCPeerConnection, RTCRtpHeaderExtensionParameters
from aiortc.rtcrtpparameters import RTCRtpParameters
from aiortc.rtp import HeaderExtensionsMap, RtpPacket, wrap_rtx

from render_server.transport.lean_receiver import LeanReceiver

from .receivers import H264, RTX, h264_receiver
from .short_loadtest import short_loadtest


def _packet(seq: int, marker: int, payload: bytes, **changes: object) -> RtpPacket:
    packet = RtpPacket(payload_type=H264, marker=marker, sequence_number=seq, timestamp=9000,
                       ssrc=1234, payload=payload)  # fmt: skip
    for name, value in changes.items():
        setattr(packet, name, value)
    return packet


async def test_the_lean_receiver_reads_header_payload_and_rtx_and_feeds_receiver_reports() -> None:
    pc = RTCPeerConnection()
    receiver = h264_receiver(pc)
    receiver._RTCRtpReceiver__rtx_ssrc[5678] = 1234  # type: ignore[attr-defined]
    seen: list[tuple[int, int, int, bytes]] = []
    codec_names: list[str] = []
    lean = LeanReceiver(
        receiver, lambda seq, ts, marker, payload, _: seen.append((seq, ts, marker, payload)),
        codec_names.append,
    )  # fmt: skip
    handle = receiver.transport._handle_rtp_data

    plain = _packet(10, 0, b"\x65abc")
    with_csrc = _packet(11, 0, b"\x41def", csrc=[1, 2])
    with_extension = _packet(12, 1, b"\x41ghi")
    with_extension.extensions.abs_send_time = 123
    await handle(plain.serialize(), 0)
    await handle(with_csrc.serialize(), 0)
    extensions = HeaderExtensionsMap()
    extensions.configure(RTCRtpParameters(headerExtensions=[RTCRtpHeaderExtensionParameters(
        id=3, uri="http://www.webrtc.org/experiments/rtp-hdrext/abs-send-time")]))  # fmt: skip
    await handle(with_extension.serialize(extensions), 0)
    padded = _packet(13, 1, b"\x41jkl", padding_size=7)
    await handle(padded.serialize(), 0)
    resent = wrap_rtx(_packet(14, 1, b"\x41mno"), payload_type=RTX, sequence_number=1, ssrc=5678)
    await handle(resent.serialize(), 0)
    probe = RtpPacket(payload_type=RTX, sequence_number=2, ssrc=5678)
    probe.padding_size = 200
    await handle(probe.serialize(), 0)
    await handle(b"\x80\x60\x00", 0)  # shorter than a header

    assert seen == [(10, 9000, 0, b"\x65abc"), (11, 9000, 0, b"\x41def"),
                    (12, 9000, 1, b"\x41ghi"), (13, 9000, 1, b"\x41jkl"),
                    (14, 9000, 1, b"\x41mno")]  # fmt: skip
    assert codec_names == ["H264"]
    assert lean.stats.packets == 6 and lean.stats.padding == 1 and lean.stats.malformed == 1
    # aiortc's receiver reports come from these statistics
    streams = receiver._RTCRtpReceiver__remote_streams  # type: ignore[attr-defined]
    assert streams[1234].packets_received == 4 and streams[1234].max_seq == 13
    assert streams[5678].packets_received == 2
    lean.rehook()  # once per transport: no second wrapper
    assert receiver.transport._handle_rtp_data is handle
    await pc.close()


async def test_a_datagram_too_short_for_rtp_is_left_to_aiortc_at_the_socket() -> None:
    from aiortc.rtcdtlstransport import State

    pc = RTCPeerConnection()
    lean = LeanReceiver(pc.addTransceiver("video", direction="recvonly").receiver, lambda *a: None)
    keyed = type("Dtls", (), {"_rx_srtp": object(), "_state": State.CONNECTED})()
    passed: list[bytes] = []

    async def aiortcs(data: bytes, arrival_ms: int) -> None:
        raise AssertionError("not RTP")

    direct = lean._direct(keyed, lambda data, addr: passed.append(data), aiortcs)
    for datagram in (b"", b"\x80", b"\x80\x60\x00\x01"):
        direct(datagram, ("127.0.0.1", 9))
    assert passed == [b"", b"\x80", b"\x80\x60\x00\x01"] and lean.stats.direct == 0
    await pc.close()


def test_the_lean_harness_counts_what_the_worker_sent(tmp_path: Path) -> None:
    report = short_loadtest(tmp_path)
    assert report["config"]["receiver"] == "lean" and report["harness"]["receiver"] == "lean"
    check = report["server_check"]
    # the worker's counters are worker-wide (no per-stream sent counter): this run's streams
    # are its only sessions, so the deltas over the run are theirs
    assert check["server_sessions_started"] == 2
    assert abs(check["frames_ratio"] - 1) <= 0.01, check
    assert abs(check["bytes_ratio"] - 1) <= 0.01, check
    assert abs(check["packets_ratio"] - 1) <= 0.01, check
    for s in report["streams"]:
        assert s["state"] == "closed" and s["frames"] > 60
        assert s["nacks_sent"] == 0 and s["plis_sent"] == 0  # the lean path sends neither
        assert s["decode_ok"], s["decode"]  # a keyframe reassembled from its packets decodes
        # read where the socket received them, not through aioice's queue: nearly all (the
        # first few may arrive before the sockets are hooked, after negotiating)
        assert s["socket_packets"] >= 0.95 * s["packets"], s
        # through the lean reader's own reads (UDP_GRO: test_udp_gro.py; a 320x240 frame is
        # one packet, so nothing here comes in runs)
        assert s["socket_reads"] > 0, s
        # every read timed by when the kernel received it, not when the harness read it
        assert s["socket_stamped"] == s["socket_reads"], s
        assert s["socket_dropped"] == 0, s  # the harness kept up: no full socket buffer
    assert report["harness"]["hold_packets_per_cpu_s"] > 0


@pytest.mark.parametrize("receiver", ["lean", "count"])
def test_streams_send_transport_feedback_the_worker_reads(tmp_path: Path, receiver: str) -> None:
    """`--transport-feedback`: each stream reports what arrived as a browser does, and the
    worker's congestion controllers read it (its paced path, not REMB). The counting receiver
    reads the numbers from the headers in the clear (`test_counting_receiver.py`)."""
    report = short_loadtest(tmp_path, "--receiver", receiver, "--no-drag", "--transport-feedback")
    assert report["config"]["transport_feedback"] is True
    sent = [s["feedback_sent"] for s in report["streams"]]
    assert min(sent) >= 40, sent  # 5 s at one every 50 ms, while packets arrive
    check = report["server_check"]
    assert 0.9 * sum(sent) <= check["server_transport_feedback"] <= sum(sent), (check, sent)
    assert abs(check["packets_ratio"] - 1) <= 0.01, check
    for s in report["streams"]:
        assert s["state"] == "closed" and s["frames"] > 60 and s["decode_ok"], s
