"""Cloud rendering streaming server: rendered 3D scenes streamed to the browser over WebRTC."""

__version__ = "0.1.0"
