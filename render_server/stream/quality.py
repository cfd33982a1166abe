"""Stream quality a browser may ask for (size, frame rate, bitrate cap), within the worker's
limits: asked-for figures are clamped, never refused."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Final

from render_server.config import Resolution, StreamConfig
from render_server.protocol.data_channel import QualityRequest

MIN_WIDTH: Final = 160
MIN_HEIGHT: Final = 90
MIN_FPS: Final = 1.0
MIN_KBPS: Final = 100


@dataclass(frozen=True)
class StreamQuality:
    """What a session's stream is: its size, frame rate and bitrate cap (kbit/s)."""

    resolution: Resolution
    fps: float
    max_kbps: int


@dataclass(frozen=True)
class QualityLimits:
    """The most a session may ask for: the worker's maximum size, its frame rate and bitrate."""

    max_resolution: Resolution
    max_fps: float
    max_kbps: int
    # for the bitrate of each size (None: max_kbps for all); not part of what the limits are
    stream: StreamConfig | None = field(default=None, compare=False)
    # the most 16x16 macroblocks a frame may have: what the browser's decoder takes of the
    # codec sent (VP8's `max-fs`; Firefox says 12288, under 4K's 32400); None: no such limit
    max_macroblocks: int | None = None

    def fit(self, resolution: Resolution) -> Resolution:
        """`resolution`, or where its frame has more than `max_macroblocks` the largest size
        of the same shape (even sides) that has no more."""
        limit = self.max_macroblocks
        if limit is None or macroblocks(resolution) <= limit:
            return resolution

        def shaped(width: int) -> Resolution:
            height = _even(width * resolution.height / resolution.width)
            return Resolution(max(MIN_WIDTH, width), max(MIN_HEIGHT, height))

        # from the area's scale, then up while whole macroblocks still fit (the count rounds
        # partial ones up), or down while they do not
        width = _even(resolution.width * math.sqrt(limit / macroblocks(resolution)))
        while width + 2 < resolution.width and macroblocks(shaped(width + 2)) <= limit:
            width += 2
        while width > MIN_WIDTH and macroblocks(shaped(width)) > limit:
            width -= 2
        return shaped(width)

    @classmethod
    def of(cls, stream: StreamConfig) -> QualityLimits:
        """A cap may go up to the bitrate of the largest stream a session may ask for."""
        top = stream.bitrate_for(stream.max_resolution, stream.fps)
        return cls(stream.max_resolution, stream.fps, top // 1000, stream)

    def stream_kbps(self, quality: StreamQuality) -> int:
        """What the encoder of this size and rate aims at, before any cap."""
        if self.stream is None:
            return self.max_kbps
        return self.stream.bitrate_for(quality.resolution, quality.fps) // 1000

    def initial(self, stream: StreamConfig) -> StreamQuality:
        """The configured stream, with no cap below the configured bitrate."""
        return StreamQuality(stream.resolution, stream.fps, self.max_kbps)

    def clamp(self, current: StreamQuality, request: QualityRequest) -> StreamQuality:
        """`current` with the asked-for figures, each clamped to its range; sides are made even
        (rounded down) for 4:2:0. Figures not asked for stay as they are."""
        resolution = current.resolution
        if request.width is not None and request.height is not None:
            width = _even(_clamp(request.width, MIN_WIDTH, self.max_resolution.width))
            height = _even(_clamp(request.height, MIN_HEIGHT, self.max_resolution.height))
            resolution = Resolution(width, height)
        resolution = self.fit(resolution)
        fps = current.fps
        if request.fps is not None:
            fps = float(_clamp(request.fps, MIN_FPS, self.max_fps))
        max_kbps = current.max_kbps
        if request.max_kbps is not None:
            max_kbps = int(_clamp(math.floor(request.max_kbps), MIN_KBPS, self.max_kbps))
        return StreamQuality(resolution, fps, max_kbps)

    def message(self, quality: StreamQuality) -> dict[str, Any]:
        """The `quality` message the worker sends: the figures applied (`maxKbps`: the most the
        encoder will spend, its own bitrate or the cap, whichever is lower) and the size limit."""
        fps = quality.fps
        return {
            "type": "quality",
            "width": quality.resolution.width,
            "height": quality.resolution.height,
            "fps": int(fps) if fps.is_integer() else fps,
            "maxKbps": min(quality.max_kbps, self.stream_kbps(quality)),
            "maxWidth": self.max_resolution.width,
            "maxHeight": self.max_resolution.height,
        }


def macroblocks(resolution: Resolution) -> int:
    """16x16 macroblocks of a frame of `resolution` (a partial one counts whole)."""
    return math.ceil(resolution.width / 16) * math.ceil(resolution.height / 16)


def _clamp(value: float, lo: float, hi: float) -> float:
    return min(max(value, lo), hi)


def _even(value: float) -> int:
    return int(value) // 2 * 2
