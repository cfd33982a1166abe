"""AV1 in aiortc: two real peer connections on loopback send pre-encoded SVT-AV1 and decode it
with libdav1d; Chromium's and Firefox's offers negotiate AV1 when it is preferred."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import av
import numpy as np
import pytest
from aiortc import RTCPeerConnection, RTCRtpSender, RTCSessionDescription
from aiortc.codecs import CODECS
from aiortc.jitterbuffer import JitterFrame
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from aiortc.rtcrtpparameters import RTCRtpCodecCapability

from render_server.transport.av1_codec import Av1Decoder, register_av1, split_payloads
from render_server.transport.av1_rtp import packetize_av1
from render_server.transport.paced_negotiation import register_transport_cc

from .support import PacketTrack
from .test_av1_rtp import encode_av1

register_av1()

WIDTH, HEIGHT = 320, 240


def av1_preferences() -> list[RTCRtpCodecCapability]:
    codecs = RTCRtpSender.getCapabilities("video").codecs
    return [c for c in codecs if c.mimeType.lower() in ("video/av1", "video/rtx")]


def video_formats(sdp: str) -> list[str]:
    line = next(line for line in sdp.splitlines() if line.startswith("m=video"))
    return line.split()[3:]


def rtpmap(sdp: str) -> dict[str, str]:
    """Payload type → `name/clock` of the video section."""
    out = {}
    for line in sdp.splitlines():
        if line.startswith("a=rtpmap:"):
            pt, name = line[len("a=rtpmap:") :].split(" ", 1)
            out[pt] = name
    return out


def fmtp(sdp: str, pt: str) -> str | None:
    prefix = f"a=fmtp:{pt} "
    return next((line[len(prefix) :] for line in sdp.splitlines() if line.startswith(prefix)), None)


def test_registration_is_idempotent_and_after_vp8_and_h264() -> None:
    register_av1()
    register_av1()
    register_transport_cc()  # as video_sender does at import, after AV1
    names = [c.mimeType for c in CODECS["video"]]
    assert names.count("video/AV1") == 1
    older = [i for i, name in enumerate(names) if name in ("video/VP8", "video/H264")]
    assert names.index("video/AV1") > max(older)
    av1 = next(c for c in CODECS["video"] if c.mimeType == "video/AV1")
    rtx = next(c for c in CODECS["video"] if c.parameters.get("apt") == av1.payloadType)
    used = [c.payloadType for kind in CODECS.values() for c in kind]
    assert len(used) == len(set(used)) and 96 <= av1.payloadType < 128
    assert rtx.mimeType == "video/rtx" and av1.parameters["profile"] == 0
    assert {(f.type, f.parameter) for f in av1.rtcpFeedback} == {
        ("nack", None),
        ("nack", "pli"),
        ("goog-remb", None),
        ("transport-cc", None),  # send_path.register_transport_cc, as on every video codec
    }


async def test_pre_encoded_av1_crosses_two_peer_connections_and_decodes() -> None:
    packets = await asyncio.to_thread(encode_av1, WIDTH, HEIGHT, 8, 300_000)
    expected = [f.to_ndarray() for f in local_decode(packets)]
    sender, receiver = RTCPeerConnection(), RTCPeerConnection()
    frames: list[av.VideoFrame] = []
    done = asyncio.Event()

    async def read(track: MediaStreamTrack) -> None:
        with contextlib.suppress(MediaStreamError):
            while len(frames) < 5:
                frames.append(await track.recv())  # type: ignore[arg-type]
        done.set()

    tasks: list[asyncio.Task[None]] = []
    receiver.on("track", lambda track: tasks.append(asyncio.ensure_future(read(track))))
    try:
        # as the project's viewers do: the receiver offers, the sender answers
        receiver.addTransceiver("video", direction="recvonly")
        transceiver = sender.addTransceiver(PacketTrack(packets), direction="sendonly")
        transceiver.setCodecPreferences(av1_preferences())
        await receiver.setLocalDescription(await receiver.createOffer())
        assert "AV1/90000" in rtpmap(receiver.localDescription.sdp).values()
        await sender.setRemoteDescription(receiver.localDescription)
        await sender.setLocalDescription(await sender.createAnswer())
        answer = sender.localDescription.sdp
        first = video_formats(answer)[0]
        assert rtpmap(answer)[first] == "AV1/90000"
        assert {rtpmap(answer)[pt] for pt in video_formats(answer)} == {"AV1/90000", "rtx/90000"}
        await receiver.setRemoteDescription(sender.localDescription)
        await asyncio.wait_for(done.wait(), 30)
    finally:
        for task in tasks:
            task.cancel()
        await sender.close()
        await receiver.close()
    assert len(frames) >= 5
    assert {(f.width, f.height) for f in frames} == {(WIDTH, HEIGHT)}
    # the pictures are the encoder's, bit for bit
    for frame, picture in zip(frames, expected, strict=False):
        assert np.array_equal(frame.to_ndarray(format="yuv420p"), picture)


def local_decode(packets: list[av.Packet[Any]]) -> list[av.VideoFrame]:
    decoder = av.CodecContext.create("libdav1d", "r")
    out: list[av.VideoFrame] = []
    for packet in packets:
        out += decoder.decode(av.Packet(bytes(packet)))  # type: ignore[attr-defined]
    out += decoder.decode(None)  # type: ignore[attr-defined]
    return out


def test_the_decoder_turns_a_broken_frame_into_the_error_aiortc_expects() -> None:
    decoder = Av1Decoder()
    payloads = packetize_av1(bytes(encode_av1(WIDTH, HEIGHT, 1, 300_000)[0]), 500)
    joined = b"".join(len(p).to_bytes(4, "big") + p for p in payloads)
    assert split_payloads(joined) == payloads
    frames: list[Any] = decoder.decode(JitterFrame(joined, 1234))
    assert [(f.width, f.height, f.pts) for f in frames] == [(WIDTH, HEIGHT, 1234)]
    # the first packet lost: the frame begins with a continuation
    missing_first = b"".join(len(p).to_bytes(4, "big") + p for p in payloads[1:])
    with pytest.raises(av.FFmpegError, match="AV1 RTP payloads: payload 0 continues an OBU"):
        decoder.decode(JitterFrame(missing_first, 0))
    with pytest.raises(ValueError, match="cut short"):
        split_payloads(joined[:10])


# -- browsers' offers ------------------------------------------------------------------------------

SESSION = """v=0
o=- 4611731400430051336 2 IN IP4 127.0.0.1
s=-
t=0 0
a=group:BUNDLE 0
a=msid-semantic: WMS
"""

TRANSPORT = """c=IN IP4 0.0.0.0
a=rtcp:9 IN IP4 0.0.0.0
a=ice-ufrag:AbCd
a=ice-pwd:abcdefghijklmnopqrstuvwx
a=ice-options:trickle
a=fingerprint:sha-256 {fingerprint}
a=setup:actpass
a=mid:0
a=recvonly
a=rtcp-mux
a=rtcp-rsize
""".format(fingerprint=":".join(["6B", "8B", "F0", "65"] * 8))


def offer(formats: list[tuple[int, str, str | None]], extensions: list[str]) -> str:
    """A recvonly video offer listing `formats` (payload type, name, fmtp) in that order."""
    lines = ["m=video 9 UDP/TLS/RTP/SAVPF " + " ".join(str(pt) for pt, _, _ in formats)]
    lines += TRANSPORT.splitlines() + extensions
    for pt, name, params in formats:
        lines.append(f"a=rtpmap:{pt} {name}/90000")
        if name not in ("rtx", "red", "ulpfec", "flexfec-03"):
            for fb in ("goog-remb", "transport-cc", "ccm fir", "nack", "nack pli"):
                lines.append(f"a=rtcp-fb:{pt} {fb}")
        if params:
            lines.append(f"a=fmtp:{pt} {params}")
    return "\r\n".join(SESSION.splitlines() + lines) + "\r\n"


def h264(mode: int, profile: str) -> str:
    return f"level-asymmetry-allowed=1;packetization-mode={mode};profile-level-id={profile}"


def chromium_offer() -> str:
    """Chromium 156's recvonly video section: VP8, VP9 ×4, H.264 ×8, AV1 profiles 0 and 1
    (on payload types below 96, as Chromium does once 96-127 are taken), RED, ULPFEC,
    FlexFEC, each with its RTX."""
    formats: list[tuple[int, str, str | None]] = [(96, "VP8", None), (97, "rtx", "apt=96")]
    for pt, profile in ((98, 0), (100, 2), (35, 1), (37, 3)):
        formats += [(pt, "VP9", f"profile-id={profile}"), (pt + 1, "rtx", f"apt={pt}")]
    for pt, mode, profile in (
        (102, 1, "42001f"),
        (104, 0, "42001f"),
        (106, 1, "42e01f"),
        (108, 0, "42e01f"),
        (127, 1, "4d001f"),
        (39, 0, "4d001f"),
        (112, 1, "64001f"),
        (114, 0, "64001f"),
    ):
        rtx = 125 if pt == 127 else 40 if pt == 39 else pt + 1
        formats += [(pt, "H264", h264(mode, profile)), (rtx, "rtx", f"apt={pt}")]
    formats += [
        (45, "AV1", "level-idx=5;profile=0;tier=0"),
        (46, "rtx", "apt=45"),
        (47, "AV1", "level-idx=5;profile=1;tier=0"),
        (48, "rtx", "apt=47"),
        (116, "red", None),
        (117, "rtx", "apt=116"),
        (118, "ulpfec", None),
        (49, "flexfec-03", "repair-window=10000000"),
    ]
    return offer(
        formats,
        [
            "a=extmap:1 urn:ietf:params:rtp-hdrext:toffset",
            "a=extmap:2 http://www.webrtc.org/experiments/rtp-hdrext/abs-send-time",
            "a=extmap:4 urn:ietf:params:rtp-hdrext:sdes:mid",
            "a=extmap:6 http://www.webrtc.org/experiments/rtp-hdrext/playout-delay",
        ],
    )


def firefox_offer() -> str:
    """Firefox 153's: `m=video 9 UDP/TLS/RTP/SAVPF 120 124 121 125 99 100 123 122 119`."""
    formats: list[tuple[int, str, str | None]] = [
        (120, "VP8", "max-fs=12288;max-fr=60"),
        (124, "rtx", "apt=120"),
        (121, "VP9", "max-fs=12288;max-fr=60"),
        (125, "rtx", "apt=121"),
        (99, "AV1", None),
        (100, "rtx", "apt=99"),
        (123, "ulpfec", None),
        (122, "red", None),
        (119, "rtx", "apt=122"),
    ]
    return offer(formats, ["a=extmap:3 urn:ietf:params:rtp-hdrext:sdes:mid"])


async def answer_to(offer_sdp: str, prefer_av1: bool) -> str:
    """The answer of a sending peer connection, as the worker's, to a browser's offer."""
    pc = RTCPeerConnection()
    try:
        track = PacketTrack([])
        transceiver = pc.addTransceiver(track, direction="sendonly")
        if prefer_av1:
            transceiver.setCodecPreferences(av1_preferences())
        await pc.setRemoteDescription(RTCSessionDescription(sdp=offer_sdp, type="offer"))
        answer = await pc.createAnswer()
        assert answer is not None
        return answer.sdp
    finally:
        await pc.close()


@pytest.mark.parametrize(
    ("browser", "pt", "rtx"), [(chromium_offer, "45", "46"), (firefox_offer, "99", "100")]
)
async def test_browsers_offers_negotiate_av1_on_their_payload_types(
    browser: Any, pt: str, rtx: str
) -> None:
    answer = await answer_to(browser(), prefer_av1=True)
    assert video_formats(answer) == [pt, rtx]
    assert rtpmap(answer)[pt] == "AV1/90000" and fmtp(answer, rtx) == f"apt={pt}"
    assert fmtp(answer, pt) == "level-idx=5;profile=0;tier=0"  # what we send: Main


async def test_chromiums_profile_1_entry_is_not_answered_as_ours() -> None:
    answer = await answer_to(chromium_offer(), prefer_av1=False)
    names = rtpmap(answer)
    formats = video_formats(answer)
    assert "45" in formats and "46" in formats
    assert "47" not in formats and "48" not in formats  # AV1 High: we send Main only
    assert names[formats[0]] == "VP8/90000"  # without a preference: the offer's order
