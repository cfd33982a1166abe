"""The counting receiver: frames and packets read off SRTP headers in the clear, a coalesced run
at a time. Its reading of a run, what it leaves to aiortc, the keyframes it unprotects whole
for the sampler (and the frames it does not), and a real run whose frames and packets match
what the worker's /metrics says it sent, its sampled keyframes decoded."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pylibsrtp
from aiortc import RTCPeerConnection, RTCRtpHeaderExtensionParameters, RTCRtpParameters
from aiortc.rtcdtlstransport import State
from aiortc.rtp import HeaderExtensionsMap, RtpPacket, wrap_rtx

from render_server.tools.loadtest.sampling import KeyframeSampler
from render_server.tools.measure.frames import ObservedFrame
from render_server.transport.counting_receiver import CountingReceiver

from .receivers import H264, RTX, h264_receiver
from .short_loadtest import short_loadtest

SEGMENT = 120


TRANSPORT_CC = "http://www.ietf.org/id/draft-holmer-rmcat-transport-wide-cc-extensions-01"


def _datagram(
    seq: int,
    timestamp: int,
    marker: int,
    extensions: HeaderExtensionsMap | None = None,
    **changes: Any,
) -> bytes:
    """An RTP packet padded to SEGMENT bytes, as SRTP would send it (header in the clear; the
    payload here stands for the encrypted one)."""
    packet = RtpPacket(payload_type=H264, marker=marker, sequence_number=seq,
                       timestamp=timestamp, ssrc=1234, payload=b"\x41" * 20)  # fmt: skip
    for name, value in changes.items():
        setattr(packet, name, value)
    data = packet.serialize(extensions) if extensions is not None else packet.serialize()
    return data + b"\0" * (SEGMENT - len(data))


def _keyed() -> Any:
    """What the counter reads of a DTLS transport whose SRTP keys are set."""
    return type("Dtls", (), {"_rx_srtp": object(), "_state": State.CONNECTED,
                             "_RTCDtlsTransport__rx_bytes": 0,
                             "_RTCDtlsTransport__rx_packets": 0})()  # fmt: skip


async def _counting() -> tuple[RTCPeerConnection, Any, CountingReceiver, list[tuple[int, ...]]]:
    pc = RTCPeerConnection()
    receiver = h264_receiver(pc)
    frames: list[tuple[int, ...]] = []
    counter = CountingReceiver(
        receiver, lambda ts, packets, size, _: frames.append((ts, packets, size))
    )
    return pc, receiver, counter, frames


async def test_a_run_is_counted_frame_by_frame_from_its_headers() -> None:
    pc, receiver, counter, frames = await _counting()
    keyed = _keyed()
    take = counter._taker(keyed)
    resent = wrap_rtx(RtpPacket(payload_type=H264, sequence_number=5, timestamp=1, ssrc=1234,
                                payload=b"\x41" * 10),
                      payload_type=RTX, sequence_number=1, ssrc=5678).serialize()  # fmt: skip
    first = b"".join([_datagram(10, 3000, 0), _datagram(11, 3000, 0), _datagram(12, 3000, 1),
                      _datagram(13, 6000, 0)])  # fmt: skip
    # a frame split across two reads, an RTX packet in the second, and a short last datagram
    second = b"".join([_datagram(14, 6000, 1), resent + b"\0" * (SEGMENT - len(resent)),
                       _datagram(15, 9000, 1)[:60]])  # fmt: skip
    assert take(first, SEGMENT, None) == 4
    assert take(second, SEGMENT, None) == 3
    assert frames == [(3000, 3, 3 * SEGMENT), (6000, 2, 2 * SEGMENT), (9000, 1, 60)]
    assert counter.stats.direct == 7 and counter.stats.packets == 6 and counter.repairs == 1
    assert keyed._RTCDtlsTransport__rx_packets == 7  # for getStats, as aiortc counts
    # aiortc's receiver reports come from these statistics: every media packet, in order
    stream = receiver._RTCRtpReceiver__remote_streams[1234]  # type: ignore[attr-defined]
    assert stream.packets_received == 6 and stream.max_seq == 15 and stream.base_seq == 10
    assert stream.packets_expected == 6  # no loss read into it
    await pc.close()


async def test_what_is_not_keyed_srtp_media_is_left_to_aiortc() -> None:
    pc, _, counter, frames = await _counting()
    keyed = _keyed()
    unkeyed = type("Dtls", (), {"_rx_srtp": None, "_state": State.CONNECTING})()
    media = _datagram(10, 3000, 1)
    assert counter._taker(unkeyed)(media, 0, None) == 0  # before the keys: aiortc's way
    take = counter._taker(keyed)
    receiver_report = bytes([0x80, 201, 0, 1]) + b"\0" * 4
    stun = b"\x00\x01\x00\x00" + b"\0" * 16
    for datagram in (receiver_report, stun, b"\x80\x60\x00", b""):
        assert take(datagram, 0, None) == 0
    # one datagram that is not media in a run leaves the whole run to aiortc
    assert take(media + receiver_report + b"\0" * (SEGMENT - 8), SEGMENT, None) == 0
    assert frames == [] and counter.stats.direct == 0
    await pc.close()


KEY = bytes(range(30))  # SRTP master key and salt


def _srtp_pair() -> tuple[pylibsrtp.Session, pylibsrtp.Session]:
    """A sender's session and the receiver's, keyed alike."""
    sending = pylibsrtp.Session(pylibsrtp.Policy(KEY, pylibsrtp.Policy.SSRC_ANY_OUTBOUND))
    receiving = pylibsrtp.Session(pylibsrtp.Policy(KEY, pylibsrtp.Policy.SSRC_ANY_INBOUND))
    return sending, receiving


def _fu_a(nal_type: int, body: bytes, parts: int) -> list[bytes]:
    """An H.264 NAL unit (header 0x60 | nal_type) cut into `parts` FU-A payloads."""
    size = -(-len(body) // parts)
    pieces = [body[i : i + size] for i in range(0, len(body), size)]
    payloads = []
    for i, piece in enumerate(pieces):
        flags = (0x80 if i == 0 else 0) | (0x40 if i == len(pieces) - 1 else 0)
        payloads.append(bytes([0x7C, flags | nal_type]) + piece)
    return payloads


async def test_sampled_keyframes_are_unprotected_whole_and_other_frames_only_peeked() -> None:
    pc = RTCPeerConnection()
    receiver = h264_receiver(pc)
    sending, receiving = _srtp_pair()
    samples: list[tuple[ObservedFrame, bytes]] = []
    sampler = KeyframeSampler(lambda f, unit: samples.append((f, unit)), every=2, codec="H264")
    frames: list[int] = []

    def counted(ts: int, packets: int, size: int, arrival: float) -> None:
        frames.append(ts)
        sampler.counted()

    counter = CountingReceiver(receiver, counted, sampler)
    keyed = _keyed()
    keyed._rx_srtp = receiving
    take = counter._taker(keyed)
    idr, inter = bytes(range(1, 200)), bytes(range(50, 230))
    sequence = 100

    def frame(timestamp: int, payloads: list[bytes], lose: int | None = None) -> None:
        nonlocal sequence
        for i, payload in enumerate(payloads):
            packet = RtpPacket(payload_type=H264, marker=int(i == len(payloads) - 1),
                               sequence_number=sequence, timestamp=timestamp, ssrc=1234,
                               payload=payload)  # fmt: skip
            sequence += 1
            if i != lose:
                assert take(sending.protect(packet.serialize()), 0, None) == 1

    frame(3000, _fu_a(5, idr, 3))  # the first keyframe is sampled
    frame(6000, _fu_a(1, inter, 3))  # not due: not even peeked
    frame(9000, _fu_a(1, inter, 3))  # due (2 frames since): peeked, not taken
    frame(12000, _fu_a(5, idr, 3), lose=1)  # taken, but a packet never came
    frame(15000, _fu_a(5, idr, 4))  # still due: taken whole
    assert frames == [3000, 6000, 9000, 12000, 15000]
    assert [(f.rtp, f.keyframe, f.complete) for f, _ in samples] == [
        (3000, True, True), (12000, True, False), (15000, True, True)
    ]  # fmt: skip
    whole = b"\x00\x00\x00\x01\x65" + idr  # the NAL unit as the decoder takes it
    assert [unit for _, unit in samples] == [whole, b"", whole]
    assert sampler.last_rtp == 15000 and not sampler.wants()
    # 3 + 1 (peeked) + 2 (of the 3 sent) + 4; the other frames' packets stayed encrypted
    assert counter.unprotected == 10 and counter.stats.unprotect_failed == 0
    assert counter.stats.packets == 15 and counter.lost_packets == 1
    await pc.close()


async def test_a_sampled_packet_that_does_not_unprotect_ends_the_sample() -> None:
    pc = RTCPeerConnection()
    receiver = h264_receiver(pc)
    sending, receiving = _srtp_pair()
    samples: list[bytes] = []
    sampler = KeyframeSampler(lambda f, unit: samples.append(unit), every=1, codec="H264")
    counter = CountingReceiver(receiver, lambda *_: sampler.counted(), sampler)
    keyed = _keyed()
    keyed._rx_srtp = receiving
    take = counter._taker(keyed)
    for seq, payload in enumerate(_fu_a(5, bytes(range(1, 200)), 3)):
        data = sending.protect(RtpPacket(payload_type=H264, marker=int(seq == 2),
                                         sequence_number=seq, timestamp=3000, ssrc=1234,
                                         payload=payload).serialize())  # fmt: skip
        if seq == 1:
            data = data[:-1] + bytes([data[-1] ^ 1])  # its tag no longer matches
        assert take(data, 0, None) == 1  # still counted
    assert samples == [b""] and counter.stats.unprotect_failed == 1
    assert counter.stats.packets == 3 and sampler.wants()
    await pc.close()


def test_the_counting_harness_counts_what_the_worker_sent(tmp_path: Path) -> None:
    report = short_loadtest(tmp_path, "--receiver", "count", "--no-drag")
    assert report["harness"]["receiver"] == "count" and report["config"]["decode"] == "keyframes"
    check = report["server_check"]
    assert check["server_sessions_started"] == 2
    assert abs(check["frames_ratio"] - 1) <= 0.01, check
    assert abs(check["packets_ratio"] - 1) <= 0.01, check
    # datagram bytes: the worker's encoded bytes plus RTP headers and SRTP's tag
    assert 1.0 < check["bytes_ratio"] < 1.5, check
    for s in report["streams"]:
        assert s["state"] == "closed" and s["frames"] > 60 and s["lost_packets"] == 0
        assert s["socket_packets"] >= s["packets"] > 60, s
        # the sampled keyframes, unprotected whole, decode to the size asked for
        assert s["decode_ok"] is True and s["decode"]["decoded"] >= 1, s["decode"]
        assert s["keyframes"] == s["decode"]["offered"], s
    assert report["harness"]["hold_packets_per_cpu_s"] > 0


async def test_transport_wide_numbers_are_read_from_the_headers_in_the_clear() -> None:
    """With `transport_feedback`, every RTP datagram's transport-wide number (RTX included)
    goes to the feedback generator at the read's arrival, as a browser would report it."""
    pc = RTCPeerConnection()
    receiver = h264_receiver(pc)
    negotiated = RTCRtpParameters(
        headerExtensions=[RTCRtpHeaderExtensionParameters(id=5, uri=TRANSPORT_CC)]
    )
    extensions = HeaderExtensionsMap()
    extensions.configure(negotiated)
    counter = CountingReceiver(receiver, lambda *_: None, transport_feedback=True)
    assert counter.feedback is not None
    take = counter._taker(_keyed())

    def numbered(seq: int, number: int, marker: int = 0, **changes: Any) -> bytes:
        packet = _datagram(seq, 3000, marker, extensions, **changes)
        return packet if number < 0 else _with_number(packet, number, extensions)

    # not negotiated yet: counted, nothing reported
    assert take(numbered(1, 7), SEGMENT, None) == 1
    assert counter.feedback.generator._arrivals == {}
    receiver.transport._rtp_header_extensions_map.configure(negotiated)
    counter.rehook()  # negotiated: the id is read again
    run = b"".join([numbered(2, 65534), numbered(3, 65535, csrc=[9, 10]), numbered(4, 0, 1),
                    numbered(5, -1)])  # the last carries no number  # fmt: skip
    assert take(run, SEGMENT, None) == 4
    arrivals = counter.feedback.generator._arrivals
    assert sorted(arrivals) == [65534, 65535, 65536]  # unwrapped across the wrap
    assert len(set(arrivals.values())) == 1  # the read's arrival, for each
    (feedback,) = counter.feedback.generator.build(max(arrivals.values()))
    assert [(seq, at is not None) for seq, at in feedback.packets] == [
        (65534, True),
        (65535, True),
        (0, True),
    ]
    assert counter.stats.packets == 5 and counter.stats.direct == 5
    counter.feedback.stop()
    await pc.close()


def _with_number(packet: bytes, number: int, extensions: HeaderExtensionsMap) -> bytes:
    parsed = RtpPacket.parse(packet.rstrip(b"\0") or packet, extensions)
    parsed.extensions.transport_sequence_number = number
    data = parsed.serialize(extensions)
    return data + b"\0" * (SEGMENT - len(data))


def test_the_counting_harness_refuses_to_decode_every_frame(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "render_server", "loadtest", "--server", "http://127.0.0.1:9",
         "--receiver", "count", "--decode", "all", "--report", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--receiver count decrypts only the keyframes it samples" in done.stderr
