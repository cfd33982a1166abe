"""The FEC path: media renumbered on the wire with room for ULPFEC packets after each
protected frame; what a browser's decoder rebuilds from them; NACKs of wire numbers turned
back into aiortc's, and FEC packets answered from what was kept."""

from __future__ import annotations

from aiortc.rtp import RtcpRtpfbPacket, RtpPacket, wrap_rtx

from render_server.transport.fec_path import (
    FecPath,
    FecPayloadTypes,
    protection_for,
    split_nacks,
)
from render_server.transport.red import unwrap_red
from render_server.transport.ulpfec_decoder import UlpfecDecoder

MEDIA_SSRC, RTX_SSRC = 1111, 2222
TYPES = FecPayloadTypes(media=102, red=120, ulpfec=121, rtx_red=122)


def frame(first_seq: int, count: int, timestamp: int = 900) -> list[bytes]:
    """A frame of aiortc's: `count` packets numbered from `first_seq`, the last marked."""
    return [
        RtpPacket(
            payload_type=102,
            marker=int(i == count - 1),
            sequence_number=(first_seq + i) & 0xFFFF,
            timestamp=timestamp,
            ssrc=MEDIA_SSRC,
            payload=bytes([i]) * (900 + 10 * i),
        ).serialize()  # fmt: skip
        for i in range(count)
    ]


def seq(packet: bytes) -> int:
    return int.from_bytes(packet[2:4], "big")


def test_protection_follows_loss() -> None:
    assert protection_for(0.0) == 0 and protection_for(0.005) == 0
    assert protection_for(0.02) == 51  # two FEC packets per ten media packets
    assert protection_for(0.3) == 128  # at most one per two


def test_an_unprotected_path_only_renumbers() -> None:
    path = FecPath(MEDIA_SSRC, RTX_SSRC, TYPES, ())
    out = [p for packet in frame(500, 5) for p in path.media(packet)]
    assert len(out) == 5 and all(p[1] & 0x7F == 102 for p in out)  # no RED, no FEC
    wire = [seq(p) for p in out]
    assert wire == [(wire[0] + i) & 0xFFFF for i in range(5)]
    assert [p[4:] for p in out] == [p[4:] for p in frame(500, 5)]  # only the number changed


def test_a_protected_frame_goes_in_red_with_fec_after_it_and_a_lost_packet_is_rebuilt() -> None:
    path = FecPath(MEDIA_SSRC, RTX_SSRC, TYPES, ())
    path.set_protection(protection_for(0.02))
    sent = frame(65530, 10)  # aiortc's numbers wrap inside the frame
    out = [p for packet in sent for p in path.media(packet)]
    assert len(out) == 12 and path.fec_sent == 2
    wire = [seq(p) for p in out]
    assert wire == [(wire[0] + i) & 0xFFFF for i in range(12)]  # FEC right after the frame
    assert all(p[1] & 0x7F == TYPES.red for p in out)
    assert [p[12] for p in out[:10]] == [102] * 10  # RED blocks of media...
    assert [p[12] for p in out[10:]] == [TYPES.ulpfec] * 2  # ...then of ULPFEC
    assert out[9][1] & 0x80 and not out[10][1] & 0x80 and not out[11][1] & 0x80  # marker kept
    # the browser loses the fourth packet: its FEC decoder rebuilds it, bit for bit
    decoder = UlpfecDecoder(MEDIA_SSRC)
    rebuilt: list[bytes] = []
    for i, packet in enumerate(out):
        if i != 3:
            rebuilt += decoder.add_red_packet(packet, TYPES.ulpfec)
    assert rebuilt == [unwrap_red(out[3], TYPES.red)]
    assert unwrap_red(out[3], TYPES.red)[12:] == sent[3][12:]


def test_protection_starts_and_stops_at_frame_boundaries() -> None:
    path = FecPath(MEDIA_SSRC, RTX_SSRC, TYPES, ())
    first = frame(0, 6)
    out = path.media(first[0])
    path.set_protection(128)  # mid-frame: the frame goes out as it started
    out += [p for packet in first[1:] for p in path.media(packet)]
    assert len(out) == 6 and all(p[1] & 0x7F == 102 for p in out)
    out = [p for packet in frame(6, 6, 1800) for p in path.media(packet)]
    assert len(out) > 6 and all(p[1] & 0x7F == TYPES.red for p in out)


def test_nacks_of_wire_numbers_become_aiortcs_or_the_kept_fec() -> None:
    path = FecPath(MEDIA_SSRC, RTX_SSRC, TYPES, ())
    path.set_protection(51)
    sent = frame(7000, 10)
    out = [p for packet in sent for p in path.media(packet)]
    media, fec = path.nack([seq(out[2]), seq(out[10]), (seq(out[0]) - 100) & 0xFFFF])
    assert media == [7002]  # the media packet, by aiortc's number; the unknown one dropped
    assert fec == [out[10]] and path.fec_resent == 1


def test_retransmissions_name_the_wire_number_and_keep_red() -> None:
    path = FecPath(MEDIA_SSRC, RTX_SSRC, TYPES, ())
    path.set_protection(51)
    sent = frame(300, 10)
    out = [p for packet in sent for p in path.media(packet)]
    original = RtpPacket.parse(sent[4])
    rtx = wrap_rtx(original, payload_type=103, sequence_number=40, ssrc=RTX_SSRC).serialize()
    again = path.retransmission(rtx)
    assert again is not None
    assert again[1] & 0x7F == TYPES.rtx_red and int.from_bytes(again[8:12], "big") == RTX_SSRC
    assert int.from_bytes(again[12:14], "big") == seq(out[4])  # the original's wire number
    assert again[14] == 102 and again[15:] == original.payload  # RED block, then the payload
    plain = path.retransmission(sent[4])  # no RTX: the packet again, as the wire had it
    assert plain == out[4]
    forgotten = RtpPacket(payload_type=102, sequence_number=9, ssrc=MEDIA_SSRC).serialize()
    assert path.retransmission(forgotten) is None


def test_split_nacks_takes_out_the_media_streams_nacks_only() -> None:
    ours = bytes(RtcpRtpfbPacket(fmt=1, ssrc=5, media_ssrc=MEDIA_SSRC, lost=[10, 11, 30]))
    other = bytes(RtcpRtpfbPacket(fmt=1, ssrc=5, media_ssrc=999, lost=[4]))
    report = bytes([0x80, 201, 0, 1]) + b"\x00\x00\x00\x07"
    lost, rest = split_nacks(report + ours + other, MEDIA_SSRC)
    assert lost == [10, 11, 30] and rest == report + other
    assert split_nacks(b"\x80", MEDIA_SSRC) == ([], b"\x80")
