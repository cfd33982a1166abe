"""aiortc's receive-side bitrate estimator (1,000 objects a peer connection for the garbage
collector to walk) is taken off the receivers whose media it never sees: the worker's
send-only video and the lean harness's receivers; a plain receiver keeps its own."""

from __future__ import annotations

from aiortc import RTCPeerConnection
from aiortc.mediastreams import VideoStreamTrack

from render_server.transport.lean_receiver import LeanReceiver
from render_server.transport.receive_estimator import ATTRIBUTE
from render_server.transport.video_sender import add_video_sender


async def test_a_plain_receiver_has_the_estimator_we_drop_elsewhere() -> None:
    pc = RTCPeerConnection()
    try:
        receiver = pc.addTransceiver("video", direction="recvonly").receiver
        assert getattr(receiver, ATTRIBUTE) is not None  # the name still reaches aiortc's
    finally:
        await pc.close()


async def test_the_workers_send_only_video_has_none() -> None:
    pc = RTCPeerConnection()
    try:
        transceiver = add_video_sender(pc, VideoStreamTrack(), "0,0", lambda: None, lambda b: None)
        assert getattr(transceiver.receiver, ATTRIBUTE) is None
    finally:
        await pc.close()


async def test_a_lean_receiver_has_none() -> None:
    pc = RTCPeerConnection()
    try:
        receiver = pc.addTransceiver("video", direction="recvonly").receiver
        LeanReceiver(receiver, lambda *a: None)
        assert getattr(receiver, ATTRIBUTE) is None
    finally:
        await pc.close()
