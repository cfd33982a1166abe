"""The playout-delay extension: negotiated with the browser and written into every packet."""

from __future__ import annotations

from aiortc.rtcrtpparameters import RTCRtpHeaderExtensionParameters, RTCRtpParameters
from aiortc.rtp import HeaderExtensions, unpack_header_extensions

from render_server.config import Resolution, StreamConfig
from render_server.tools.viewer import Viewer
from render_server.transport.header_extensions import PLAYOUT_DELAY_URI, SenderExtensionsMap

from .support import ServerFactory, ws_url


def test_the_map_writes_zero_delay_beside_aiortcs_own_extensions() -> None:
    extensions = SenderExtensionsMap((0, 0))
    extensions.configure(
        RTCRtpParameters(
            headerExtensions=[
                RTCRtpHeaderExtensionParameters(id=4, uri="urn:ietf:params:rtp-hdrext:sdes:mid"),
                RTCRtpHeaderExtensionParameters(id=9, uri=PLAYOUT_DELAY_URI),
            ]
        )
    )
    profile, data = extensions.set(HeaderExtensions(mid="0"))
    assert dict(unpack_header_extensions(profile, data)) == {4: b"0", 9: b"\x00\x00\x00"}
    low = SenderExtensionsMap((0, 50))  # 0 .. 500 ms: 12 bits each
    low.configure(RTCRtpParameters(headerExtensions=[
        RTCRtpHeaderExtensionParameters(id=3, uri=PLAYOUT_DELAY_URI)]))  # fmt: skip
    assert dict(unpack_header_extensions(*low.set(HeaderExtensions()))) == {3: b"\x00\x00\x32"}
    unnegotiated = SenderExtensionsMap((0, 0))
    unnegotiated.configure(RTCRtpParameters())
    assert unnegotiated.set(HeaderExtensions()) == (0, b"")


async def test_the_worker_answers_with_the_extension_and_streams(
    start_server: ServerFactory,
) -> None:
    stream = StreamConfig(resolution=Resolution(160, 120))  # playout delay "low" by default
    server = await start_server(stream=stream)
    async with Viewer(ws_url(server)) as viewer:
        frame = await viewer.next_frame(timeout=20)
        assert (frame.width, frame.height) == (160, 120)
        assert viewer.pc is not None and viewer.pc.remoteDescription is not None
        assert PLAYOUT_DELAY_URI in viewer.pc.remoteDescription.sdp


def test_the_transport_wide_number_sits_first_where_the_send_path_writes_it() -> None:
    from aiortc.rtp import RtpPacket

    from render_server.transport.header_extensions import (
        TRANSPORT_CC_URI,
        write_transport_sequence,
    )

    extensions = SenderExtensionsMap((0, 50), transport_cc=True)
    extensions.configure(
        RTCRtpParameters(
            headerExtensions=[
                RTCRtpHeaderExtensionParameters(id=1, uri="urn:ietf:params:rtp-hdrext:sdes:mid"),
                RTCRtpHeaderExtensionParameters(id=5, uri=TRANSPORT_CC_URI),
                RTCRtpHeaderExtensionParameters(id=9, uri=PLAYOUT_DELAY_URI),
            ]
        )
    )
    assert extensions.transport_cc_id == 5
    packet = RtpPacket(payload_type=96, sequence_number=7, timestamp=1, ssrc=1234)
    packet.extensions.mid = "0"
    packet.payload = b"\x01" * 100
    data = bytearray(packet.serialize(extensions))
    assert write_transport_sequence(data, 5, 0xABCD)
    parsed = RtpPacket.parse(bytes(data), extensions)
    assert parsed.extensions.transport_sequence_number == 0xABCD
    assert parsed.extensions.mid == "0" and parsed.payload == packet.payload
    assert dict(unpack_header_extensions(*extensions.set(packet.extensions)))[9] == b"\x00\x00\x32"
    # a packet without the placeholder is left alone
    bare = bytearray(RtpPacket(payload_type=96, sequence_number=8, ssrc=1234).serialize())
    assert not write_transport_sequence(bare, 5, 1)
    # not negotiated: no placeholder written, no id
    quiet = SenderExtensionsMap(transport_cc=True)
    quiet.configure(RTCRtpParameters())
    assert quiet.transport_cc_id is None and quiet.set(HeaderExtensions()) == (0, b"")
