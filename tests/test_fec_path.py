"""The FEC path: media renumbered on the wire with room for ULPFEC packets after each
protected frame; what a browser's decoder rebuilds from them; NACKs of wire numbers turned
back into aiortc's, and FEC packets answered from what was kept."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

from aiortc.rtp import RtcpRtpfbPacket, RtpPacket, wrap_rtx

from render_server.transport.congestion.types import PacketFeedback
from render_server.transport.fec_path import (
    FRESH_S,
    MIN_FACTOR,
    FecPath,
    FecPayloadTypes,
    protection_for,
    split_nacks,
)
from render_server.transport.paced_negotiation import fec_payload_types
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
    assert protection_for(0.01) == 51  # two FEC packets per ten media packets
    assert protection_for(0.02) == 102  # four per ten
    assert protection_for(0.3) == 128  # at most one per two


def held_frames(media_packets: int, factor: int, loss: float) -> float:
    """The share of frames of `media_packets` protected at `factor` whose media ULPFEC does
    not rebuild when each packet (media or FEC) is lost with probability `loss`: every loss
    pattern of up to three packets decoded, more counted as not rebuilt."""
    path = FecPath(MEDIA_SSRC, RTX_SSRC, TYPES, ())
    path.set_protection(factor)
    out = [p for packet in frame(0, media_packets) for p in path.media(packet)]
    total, held = len(out), 0.0
    for k in range(1, 4):
        for lost in itertools.combinations(range(total), k):
            if all(i >= media_packets for i in lost):
                continue  # only FEC lost: the frame is whole
            decoder = UlpfecDecoder(MEDIA_SSRC)
            rebuilt = [
                seq(r)
                for i, packet in enumerate(out)
                if i not in lost
                for r in decoder.add_red_packet(packet, TYPES.ulpfec)
            ]
            if not all(seq(out[i]) in rebuilt for i in lost if i < media_packets):
                held += loss**k * (1 - loss) ** (total - k)
    return held + sum(
        math.comb(total, k) * loss**k * (1 - loss) ** (total - k) for k in range(4, total + 1)
    )


def test_at_2_percent_loss_a_ten_packet_frame_waits_for_a_nack_one_time_in_500() -> None:
    ours = held_frames(10, protection_for(0.02), 0.02)
    two_per_ten = held_frames(10, 51, 0.02)
    none = 1 - 0.98**10
    print(f"frames held: {ours:.4%} ({protection_for(0.02)}), {two_per_ten:.4%} (51), {none:.2%}")
    assert ours < 0.002 < 0.008 < two_per_ten < 0.012 and none > 0.18


def test_an_unprotected_path_only_renumbers() -> None:
    path = FecPath(MEDIA_SSRC, RTX_SSRC, TYPES, ())
    path.set_protection(0)  # a path known to lose nothing
    out = [p for packet in frame(500, 5) for p in path.media(packet)]
    assert len(out) == 5 and all(p[1] & 0x7F == 102 for p in out)  # no RED, no FEC
    wire = [seq(p) for p in out]
    assert wire == [(wire[0] + i) & 0xFFFF for i in range(5)]
    assert [p[4:] for p in out] == [p[4:] for p in frame(500, 5)]  # only the number changed


def test_a_protected_frame_goes_in_red_with_fec_after_it_and_a_lost_packet_is_rebuilt() -> None:
    path = FecPath(MEDIA_SSRC, RTX_SSRC, TYPES, ())
    path.set_protection(51)
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
    path.set_protection(0)
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


def rtx_numbers(start: int) -> Callable[[], int]:
    counter = itertools.count(start)
    return lambda: next(counter) & 0xFFFF


def unwrap_rtx(packet: bytes, media_ssrc: int, red: int) -> bytes:
    """What the receiver restores from an RTX packet: the original number and type, back on
    the media stream."""
    header = 12 + 4 * (packet[0] & 0x0F)
    if packet[0] & 0x10:
        header += 4 + 4 * int.from_bytes(packet[header + 2 : header + 4], "big")
    return b"".join(
        (
            packet[:1],
            bytes((packet[1] & 0x80 | red,)),
            packet[header : header + 2],
            packet[4:8],
            media_ssrc.to_bytes(4, "big"),
            packet[12:header],
            packet[header + 2 :],
        )
    )


def test_a_frames_last_fec_packet_goes_once_more_as_an_rtx_copy_that_stands_in_for_it() -> None:
    numbers = rtx_numbers(65535)
    path = FecPath(MEDIA_SSRC, RTX_SSRC, TYPES, (), numbers)
    path.set_protection(51)
    assert path.share == 51 + 26
    out = [p for packet in frame(100, 10) for p in path.media(packet)]
    assert len(out) == 13 and path.fec_sent == 2  # media, FEC, then the last FEC's copy
    last, copy = out[11], out[12]
    assert int.from_bytes(copy[8:12], "big") == RTX_SSRC
    assert copy[1] == TYPES.rtx_red  # RTX for RED, marker clear
    assert copy[4:8] == last[4:8]  # the timestamp
    assert seq(copy) == 65535 and numbers() == 0  # the caller's RTX number, taken once
    assert unwrap_rtx(copy, MEDIA_SSRC, TYPES.red) == last  # bit for bit
    # the browser loses a media packet and the last FEC packet: the copy rebuilds it
    decoder = UlpfecDecoder(MEDIA_SSRC)
    rebuilt: list[bytes] = []
    for i, packet in enumerate(out):
        if i in (4, 11):
            continue
        if i == 12:
            packet = unwrap_rtx(packet, MEDIA_SSRC, TYPES.red)
        rebuilt += decoder.add_red_packet(packet, TYPES.ulpfec)
    assert unwrap_red(out[4], TYPES.red) in rebuilt
    # an unprotected frame has no FEC to copy
    path.set_protection(0)
    assert len([p for packet in frame(110, 4, 1800) for p in path.media(packet)]) == 4
    assert path.share == 0


def test_no_copies_without_rtx_for_red_or_numbers_to_send_them_with() -> None:
    no_rtx_red = FecPayloadTypes(media=102, red=120, ulpfec=121, rtx_red=None)
    for path in (
        FecPath(MEDIA_SSRC, RTX_SSRC, no_rtx_red, (), rtx_numbers(0)),
        FecPath(MEDIA_SSRC, RTX_SSRC, TYPES, ()),
    ):
        path.set_protection(51)
        assert path.share == 51
        out = [p for packet in frame(100, 10) for p in path.media(packet)]
        assert len(out) == 12


def test_on_a_protected_path_each_retransmission_goes_twice_under_rtx_numbers_of_its_own() -> None:
    """A lost retransmission costs the frame another NACK round trip: while protecting, a
    media packet's retransmission and a FEC packet's resend each get an RTX copy that the
    receiver restores to the same packet."""
    numbers = rtx_numbers(500)
    path = FecPath(MEDIA_SSRC, RTX_SSRC, TYPES, (), numbers)
    path.set_protection(51)
    sent = frame(300, 10)
    out = [p for packet in sent for p in path.media(packet)]  # 10 media, 2 FEC, 1 copy
    rtx = wrap_rtx(RtpPacket.parse(sent[4]), payload_type=103, sequence_number=40,
                   ssrc=RTX_SSRC).serialize()  # fmt: skip
    first, second = path.retransmissions(rtx)
    assert first == path.retransmission(rtx)
    assert seq(second) == 501 and second[:2] == first[:2] and second[4:] == first[4:]
    assert unwrap_rtx(second, MEDIA_SSRC, TYPES.red) == out[4]  # the media packet, in RED
    media, fec = path.nack([seq(out[11])])
    assert media == [] and fec[0] == out[11]
    assert seq(fec[1]) == 502 and unwrap_rtx(fec[1], MEDIA_SSRC, TYPES.red) == out[11]
    assert path.resend_copies == 2 and path.fec_resent == 1
    # a clean path (no protection) sends each once; so does one without RTX numbers
    path.set_protection(0)
    assert path.retransmissions(rtx) == [first] and path.nack([seq(out[11])])[1] == [out[11]]
    bare = FecPath(MEDIA_SSRC, RTX_SSRC, TYPES, ())
    bare.set_protection(51)
    sent = frame(300, 10)
    out = [p for packet in sent for p in bare.media(packet)]
    assert len(bare.retransmissions(rtx)) == 1 and len(bare.nack([seq(out[10])])[1]) == 1
    assert bare.resend_copies == 0 and path.resend_copies == 2


def test_an_h264_fec_packet_lost_with_its_copy_is_sent_again_once_feedback_shows_it() -> None:
    """H.264's receiver holds every later frame for a lost FEC packet: one that transport
    feedback reports lost with its RTX copy goes again at once, not after a NACK that may be
    lost too; one of the two received, or VP8's, does not."""
    path = FecPath(MEDIA_SSRC, RTX_SSRC, IN_ORDER, (), rtx_numbers(900))
    path.set_protection(102)
    out = [p for packet in frame(100, 12) for p in path.media(packet)]
    fec = [p for p in out if int.from_bytes(p[8:12], "big") == MEDIA_SSRC and p[12] == 121]
    copies = [p for p in out if int.from_bytes(p[8:12], "big") == RTX_SSRC]
    assert len(fec) == len(copies) >= 2
    for transport, packet in enumerate(out, start=5000):
        path.on_sent(packet, transport)
    numbered = {bytes(p): t for t, p in enumerate(out, start=5000)}
    lost = {numbered[fec[0]], numbered[copies[0]], numbered[fec[1]]}  # the second's copy came
    reports = [PacketFeedback(t, None if t in lost else 1.0) for t in range(5000, 5000 + len(out))]
    resent = path.on_feedback(reports)
    assert resent[0] == fec[0] and unwrap_rtx(resent[1], MEDIA_SSRC, TYPES.red) == fec[0]
    assert len(resent) == 2 and path.holes is not None and path.holes.refilled == 1
    assert path.on_feedback(reports) == []  # told once
    # the resent packets are themselves watched: lost again, they go again
    for transport, packet in enumerate(resent, start=6000):
        path.on_sent(packet, transport)
    assert path.on_feedback([PacketFeedback(6000, None), PacketFeedback(6001, None)])[0] == fec[0]
    vp8 = FecPath(MEDIA_SSRC, RTX_SSRC, TYPES, (), rtx_numbers(0))
    vp8.set_protection(102)
    out = [p for packet in frame(100, 12) for p in vp8.media(packet)]
    for transport, packet in enumerate(out):
        vp8.on_sent(packet, transport)
    assert (
        vp8.holes is None
        and vp8.on_feedback([PacketFeedback(t, None) for t in range(len(out))]) == []
    )


def test_protection_holds_the_highest_loss_of_the_last_ten_seconds() -> None:
    path = FecPath(MEDIA_SSRC, RTX_SSRC, TYPES, (), clock=lambda: -FRESH_S)
    assert path.protection(0.0, 0.0) == 0
    assert path.protection(1.0, 0.02) == protection_for(0.02)
    # half-second windows of 2 % random loss read 0 now and then: the protection stays
    assert path.protection(1.5, 0.0) == protection_for(0.02)
    assert path.protection(6.0, 0.012) == protection_for(0.02)
    assert path.protection(7.0, 0.05) == protection_for(0.05)  # more loss: more at once
    assert path.protection(16.5, 0.0) == protection_for(0.05)  # 9.5 s ago: still held
    assert path.protection(17.5, 0.0) == 0  # ten seconds without loss: none


def test_a_new_path_is_protected_until_its_loss_is_known() -> None:
    """A path's first reports say little: its first FRESH_S go out at MIN_FACTOR at least,
    from the first frame, more where the reports already show more loss."""
    path = FecPath(MEDIA_SSRC, RTX_SSRC, TYPES, (), clock=lambda: 100.0)
    assert path.factor == MIN_FACTOR
    out = [p for packet in frame(500, 10) for p in path.media(packet)]
    assert len(out) == 12 and path.fec_sent == 2  # the first frame is protected
    assert path.protection(100.5, 0.0) == MIN_FACTOR
    assert path.protection(101.0, 0.05) == protection_for(0.05)
    assert path.protection(100.0 + FRESH_S, 0.0) == protection_for(0.05)  # held, as any
    fresh = FecPath(MEDIA_SSRC, RTX_SSRC, TYPES, (), clock=lambda: 100.0)
    assert fresh.protection(100.0 + FRESH_S - 0.01, 0.0) == MIN_FACTOR
    assert fresh.protection(100.0 + FRESH_S, 0.0) == 0  # known by now: a clean path


def answer(first: str) -> str:
    """A browser-facing answer's video section with `first` as its media codec."""
    rtpmaps = {"H264": "102 H264/90000", "VP8": "96 VP8/90000"}
    pt = rtpmaps[first].split()[0]
    return "\r\n".join([
        "v=0", "o=- 1 1 IN IP4 0.0.0.0", "s=-", "t=0 0",
        f"m=video 9 UDP/TLS/RTP/SAVPF {pt} 103 120 122 121", "c=IN IP4 0.0.0.0",
        "a=mid:0", "a=sendonly", "a=rtcp-mux",
        f"a=rtpmap:{rtpmaps[first]}", "a=rtpmap:103 rtx/90000", f"a=fmtp:103 apt={pt}",
        "a=rtpmap:120 red/90000", "a=rtpmap:122 rtx/90000", "a=fmtp:122 apt=120",
        "a=rtpmap:121 ulpfec/90000", "",
    ])  # fmt: skip


def test_the_answer_names_the_payload_types_and_whether_frames_wait_in_order() -> None:
    h264 = fec_payload_types(answer("H264"))
    vp8 = fec_payload_types(answer("VP8"))
    assert h264 == FecPayloadTypes(102, 120, 121, 122, in_order=True)
    assert vp8 == FecPayloadTypes(96, 120, 121, 122, in_order=False)
    assert fec_payload_types(answer("VP8").replace("a=rtpmap:121 ulpfec/90000\r\n", "")) is None
    assert fec_payload_types("not sdp") is None


IN_ORDER = FecPayloadTypes(media=102, red=120, ulpfec=121, rtx_red=122, in_order=True)


def test_an_in_order_codec_without_copies_gets_one_fec_packet_that_rebuilds_any_one() -> None:
    path = FecPath(MEDIA_SSRC, RTX_SSRC, IN_ORDER, ())  # no RTX numbers: no copies
    path.set_protection(protection_for(0.05))  # much loss: still one FEC packet
    assert path.share == 26
    out = [p for packet in frame(300, 9) for p in path.media(packet)]
    assert len(out) == 10 and path.fec_sent == 1  # nine media, the FEC packet
    for lost in range(9):
        decoder = UlpfecDecoder(MEDIA_SSRC)
        rebuilt = [r for i, p in enumerate(out) if i != lost
                   for r in decoder.add_red_packet(p, TYPES.ulpfec)]  # fmt: skip
        assert rebuilt == [unwrap_red(out[lost], TYPES.red)]


def test_an_in_order_codec_with_copies_gets_full_protection_and_a_copy_of_each_fec() -> None:
    path = FecPath(MEDIA_SSRC, RTX_SSRC, IN_ORDER, (), rtx_numbers(500))
    path.set_protection(protection_for(0.02))
    assert path.share == 2 * protection_for(0.02)
    out = [p for packet in frame(300, 12) for p in path.media(packet)]
    fec = path.fec_sent
    assert fec == 5 and len(out) == 12 + 2 * fec  # media, its FEC packets, their copies
    originals, copies = out[12 : 12 + fec], out[12 + fec :]
    assert [seq(c) for c in copies] == list(range(500, 500 + fec))
    assert [unwrap_rtx(c, MEDIA_SSRC, TYPES.red) for c in copies] == originals


def held_in_order(media_packets: int, copies: bool, loss: float) -> float:
    """The share of H.264 frames of `media_packets` (at 2 % loss's protection) that wait for
    a NACK when each packet on the wire is lost with probability `loss`: a media packet FEC
    does not rebuild, or a FEC packet lost with its copy (a hole that holds the next frame).
    Every loss pattern of up to three packets is decoded, the copies standing in for their
    originals; more are counted as held."""
    path = FecPath(MEDIA_SSRC, RTX_SSRC, IN_ORDER, (), rtx_numbers(0) if copies else None)
    path.set_protection(protection_for(0.02))
    out = [p for packet in frame(0, media_packets) for p in path.media(packet)]
    fec = path.fec_sent
    total, held = len(out), 0.0
    for k in range(1, 4):
        for lost in itertools.combinations(range(total), k):
            arrived = [i for i in range(total) if i not in lost]
            wire = [
                unwrap_rtx(out[i], MEDIA_SSRC, TYPES.red) if i >= media_packets + fec else out[i]
                for i in arrived
            ]
            if len({seq(p) for p in wire}) < media_packets + fec:
                decoder = UlpfecDecoder(MEDIA_SSRC)
                got = {seq(p) for p in wire}
                got |= {seq(r) for p in wire for r in decoder.add_red_packet(p, TYPES.ulpfec)}
                if len(got) < media_packets + fec:
                    held += loss**k * (1 - loss) ** (total - k)
    return held + sum(
        math.comb(total, k) * loss**k * (1 - loss) ** (total - k) for k in range(4, total + 1)
    )


def test_at_2_percent_loss_copies_leave_a_fifteenth_of_the_h264_frames_waiting() -> None:
    ours = held_in_order(12, True, 0.02)
    one_fec = held_in_order(12, False, 0.02)
    print(f"twelve-packet H.264 frames held: {ours:.3%} with copies, {one_fec:.3%} without")
    assert ours < 0.003 and one_fec > 0.03
