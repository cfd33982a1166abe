"""Encoders: frames in, compressed packets out (PyAV: libx264 on the CPU)."""

from render_server.encode.convert import YuvConverter, rgb_to_yuv420
from render_server.encode.protocol import EncodedPacket, Encoder
from render_server.encode.pyav_encoder import PyavVideoEncoder
from render_server.encode.x264 import create_x264_encoder, x264_options

__all__ = [
    "EncodedPacket",
    "Encoder",
    "YuvConverter",
    "PyavVideoEncoder",
    "create_x264_encoder",
    "rgb_to_yuv420",
    "x264_options",
]
