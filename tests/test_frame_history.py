"""The frame-at-a-time history gives, for every slot, the packet aiortc's per-packet history
would hold there: across the 16-bit wrap and the end of the slots, after newer frames
overwrite older ones, for a frame longer than the history, and after the history grows."""

from __future__ import annotations

import gc
from typing import Any

import pytest
from aiortc.rtp import HeaderExtensions

from render_server.transport.frame_history import FrameHistory, HistoryPacket, sent_frame

from .gc_visits import gc_visits


def fields(packet: Any) -> tuple[Any, ...]:
    return (
        packet.payload_type, packet.marker, packet.sequence_number, packet.timestamp,
        packet.ssrc, packet.payload, packet.extensions,
    )  # fmt: skip


def kept_both_ways(frames: list[tuple[int, int, int]], size: int) -> tuple[FrameHistory, dict]:
    """(first sequence, packet count, timestamp) frames into ours and into aiortc's way."""
    ours, theirs = FrameHistory(), {}
    extensions = HeaderExtensions(abs_send_time=7, mid="0")
    for first, count, timestamp in frames:
        payloads = [f"{timestamp}:{i}".encode() for i in range(count)]
        ours.add(sent_frame(first, payloads, 102, timestamp, 0xABC, extensions, size))
        for i, payload in enumerate(payloads):  # what aiortc's loop does per packet
            number = (first + i) & 0xFFFF
            theirs[number % size] = HistoryPacket(
                102, int(i == count - 1), number, timestamp, 0xABC, payload, extensions
            )
    return ours, theirs


def test_every_slot_holds_what_a_per_packet_history_holds() -> None:
    size = 512
    frames, sequence = [], 65_000  # wraps the 16-bit numbers and the slots several times
    for n in range(60):
        count = [1, 37, 3, 200, 12][n % 5]
        frames.append((sequence, count, 3000 * n))
        sequence = (sequence + count) & 0xFFFF
    ours, theirs = kept_both_ways(frames, size)
    assert set(ours) == set(theirs)
    for key in range(size):
        assert fields(ours.get(key)) == fields(theirs[key])
        assert fields(ours[key]) == fields(theirs[key])
    assert ours.get(size + 5) is None and ours.get(size + 5, "none") == "none"


def test_a_frame_longer_than_the_history_keeps_its_last_packets() -> None:
    ours, theirs = kept_both_ways([(100, 1200, 90_000)], size=512)
    assert len(ours) == 512
    for key in range(512):
        assert fields(ours.get(key)) == fields(theirs[key])
    assert ours.get(1299 % 512).marker == 1


def test_frames_kept_before_the_history_grew_are_found_under_the_new_size() -> None:
    """aiortc looks a NACKed packet up by its number modulo the size in force at the time."""
    extensions = HeaderExtensions()
    history = FrameHistory()
    history.add(sent_frame(1000, [b"a", b"b"], 102, 0, 1, extensions, 512))
    history.add(sent_frame(1002, [b"c"], 102, 3000, 1, extensions, 1024))
    assert history.get(1001 % 1024).sequence_number == 1001
    assert history.get(1001 % 1024).payload == b"b"
    assert history.get(1002 % 1024).sequence_number == 1002
    assert history.get(1001 % 512 + 2048) is None and 5000 not in history


def test_cleared_it_holds_nothing_and_keeps_its_size() -> None:
    history, _ = kept_both_ways([(10, 5, 0)], size=512)
    history.clear()
    assert len(history) == 0 and history.get(12) is None
    with pytest.raises(KeyError):
        history[12]
    history.add(sent_frame(20, [b"x"], 102, 1, 1, HeaderExtensions(), 512))
    assert list(history) == [20] and history[20].payload == b"x"


async def test_nacks_are_counted_against_the_history_the_frame_sender_put_in_place() -> None:
    """The session wraps `_retransmit` to count before the frame sender replaces aiortc's
    history (stream/session.py): the count must read the history in place at each NACK."""
    from render_server.transport.frame_sender import FrameSender
    from render_server.transport.retransmission import count_retransmits, history_size

    class Sender:  # an RTCRtpSender as far as these two read it
        def __init__(self) -> None:
            self._RTCRtpSender__rtp_history: dict[int, Any] = {}
            self.resent: list[int] = []

        async def _retransmit(self, sequence_number: int) -> None:
            self.resent.append(sequence_number)

    sender = Sender()
    heard: list[bool] = []
    count_retransmits(sender, heard.append)  # type: ignore[arg-type]
    FrameSender(sender, send_frame=None).install()  # type: ignore[arg-type]
    history = sender._RTCRtpSender__rtp_history
    assert isinstance(history, FrameHistory)
    history.add(sent_frame(500, [b"a", b"b"], 102, 0, 1, HeaderExtensions(), history_size()))
    await sender._retransmit(501)
    await sender._retransmit(9_000)  # never sent
    assert heard == [True, False] and sender.resent == [501, 9_000]


def test_a_4k60_streams_history_gives_a_full_collection_next_to_nothing_to_walk() -> None:
    """8,192 slots, ~215 frames of 38 packets: the collector that stops every stream of the
    process visits a few hundred references, not every slot (16,384 as a dict)."""
    history = FrameHistory()
    extensions = HeaderExtensions(abs_send_time=7, mid="0")
    for n in range(400):
        payloads = [bytes([n % 256]) * 1100 for _ in range(38)]  # the packetizer's list
        history.add(sent_frame(n * 38, payloads, 102, 1500 * n, 1, extensions, 8192))
    # a tuple is untracked on a pass that finds what it holds untracked: the payloads' tuple on
    # the first, the record on the second at the latest (the pass may see it first)
    gc.collect()
    gc.collect()
    assert len(history) == 8192
    assert gc_visits(history) < 1_000
    packet = history.get(9)  # the newest packet numbered 9 modulo 8,192: 8,201, frame 215
    assert packet.sequence_number == 8201 and packet.payload == bytes([215]) * 1100
