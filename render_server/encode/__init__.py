"""Encoders: frames in, compressed packets out (PyAV: libx264 on the CPU)."""

from .convert import YuvConverter, rgb_to_yuv420
from .protocol import Encoder
from .pyav_encoder import PyavVideoEncoder
from .x264 import create_x264_encoder, x264_options

__all__ = [
    "Encoder",
    "YuvConverter",
    "PyavVideoEncoder",
    "create_x264_encoder",
    "rgb_to_yuv420",
    "x264_options",
]
