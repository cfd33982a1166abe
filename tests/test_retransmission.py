"""The NACK history spans time: sized for the highest bit rate streamed, never shrunk."""

from __future__ import annotations

import pytest
from aiortc import rtcrtpsender

from render_server.transport.retransmission import (
    HISTORY_S,
    MAX_HISTORY,
    MIN_HISTORY,
    PACKET_BYTES,
    history_for,
    history_size,
    size_history,
)


@pytest.mark.parametrize("bitrate", [1_000_000, 4_000_000, 25_000_000, 60_000_000])
def test_the_history_covers_its_seconds_at_the_bit_rate(bitrate: int) -> None:
    size = history_for(bitrate)
    assert size & (size - 1) == 0 and 65536 % size == 0  # sequence numbers wrap cleanly
    assert MIN_HISTORY <= size <= MAX_HISTORY
    seconds = size * PACKET_BYTES * 8 / bitrate
    assert seconds >= HISTORY_S or size == MAX_HISTORY, (bitrate, size, seconds)
    assert history_for(25_000_000) > 128 * 16  # aiortc's own: 30 ms of a 4K stream


def test_the_process_keeps_the_largest_history_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rtcrtpsender, "RTP_HISTORY_SIZE", 128)  # aiortc's default
    large = size_history(25_000_000)
    assert history_size() == large == history_for(25_000_000)
    assert size_history(1_000_000) == large  # a smaller worker does not shrink it
