"""The playout-delay extension: negotiated with the browser and written into every packet."""

from __future__ import annotations

from aiortc.rtcrtpparameters import RTCRtpHeaderExtensionParameters, RTCRtpParameters
from aiortc.rtp import HeaderExtensions, unpack_header_extensions

from render_server.config import Resolution, StreamConfig
from render_server.tools.viewer import Viewer
from render_server.transport.playout_delay import PLAYOUT_DELAY_URI, PlayoutDelayExtensionsMap

from .support import ServerFactory, ws_url


def test_the_map_writes_zero_delay_beside_aiortcs_own_extensions() -> None:
    extensions = PlayoutDelayExtensionsMap()
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
    low = PlayoutDelayExtensionsMap(0, 50)  # 0 .. 500 ms: 12 bits each
    low.configure(RTCRtpParameters(headerExtensions=[
        RTCRtpHeaderExtensionParameters(id=3, uri=PLAYOUT_DELAY_URI)]))  # fmt: skip
    assert dict(unpack_header_extensions(*low.set(HeaderExtensions()))) == {3: b"\x00\x00\x32"}
    unnegotiated = PlayoutDelayExtensionsMap()
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
