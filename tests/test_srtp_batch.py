"""The batch protector writes the same SRTP packets as pylibsrtp's own `protect` (a second
session with the same key makes the reference), which unprotect back to the plain packets; a
packet libsrtp cannot take is refused alone and the rest of the batch goes on."""

from __future__ import annotations

import os

from pylibsrtp import Policy, Session

from render_server.transport.srtp_batch import BATCH, BatchProtector, batches


def session(key: bytes, direction: int) -> Session:
    return Session(Policy(key=key, ssrc_type=direction))


def rtp(sequence: int, size: int, ssrc: int = 0x1234) -> bytes:
    header = bytes([0x80, 96]) + sequence.to_bytes(2, "big") + (9000).to_bytes(4, "big")
    return header + ssrc.to_bytes(4, "big") + os.urandom(size - 12)


def test_the_same_packets_as_pylibsrtp_and_they_unprotect() -> None:
    key = os.urandom(30)
    ours, reference = (session(key, Policy.SSRC_ANY_OUTBOUND) for _ in range(2))
    receiver = session(key, Policy.SSRC_ANY_INBOUND)
    protector = BatchProtector(ours)
    packets = [rtp(65_530 + i & 0xFFFF, 1200 - (i % 3)) for i in range(100)]  # over the wrap
    refused: list[Exception] = []
    for turn in batches(packets):
        wires, plains = protector.protect(turn, refused.append)
        assert [bytes(w) for w in wires] == [reference.protect(p) for p in turn]
        assert plains == list(turn)
        assert [receiver.unprotect(bytes(w)) for w in wires] == list(turn)
    assert refused == []


def test_a_packet_too_long_is_refused_alone() -> None:
    key = os.urandom(30)
    ours, reference = (session(key, Policy.SSRC_ANY_OUTBOUND) for _ in range(2))
    protector = BatchProtector(ours)
    good, long = rtp(1, 1000), rtp(2, 1400)
    refused: list[Exception] = []
    wires, plains = protector.protect([good, long, rtp(3, 500)], refused.append)
    assert len(refused) == 1 and "too long" in str(refused[0])
    assert plains == [good, plains[1]] and plains[1][2:4] == (3).to_bytes(2, "big")
    assert bytes(wires[0]) == reference.protect(good)


def test_batches_are_cut_at_the_buffers_size() -> None:
    assert [len(b) for b in batches(list(range(BATCH * 2 + 5)))] == [BATCH, BATCH, 5]
    assert batches([1, 2]) == [[1, 2]]
