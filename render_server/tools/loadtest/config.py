"""What a load test asks for: one typed place, checked before anything connects."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from render_server.config import MAX_FPS, ConfigError, Resolution
from render_server.encode.codecs import CODECS
from render_server.tools.loadtest.wakes import COUNT_INTERVAL_S

MAX_STREAMS = 1000
MAX_PROCESSES = 64
RECEIVERS = ("lean", "full", "count")
DECODE_MODES = ("none", "keyframes", "all")
DECODERS = ("auto", "cpu", "nvdec")
MAX_WAKE_MS = 50.0  # a frame interval at 20 fps: more would hold a stream's frames together
DEFAULT_MIN_FPS_SHARE = 0.95  # without --min-fps, a stream under 95 % of the asked rate fails


@dataclass(frozen=True)
class LoadTestConfig:
    """A run: `streams` sessions on `server`, started evenly over `ramp_s` seconds, held for
    `duration_s` seconds after the ramp, then closed. Each asks for `resolution` at `fps` (and
    `max_kbps`, when given) with a `quality` message."""

    server: str
    streams: int = 20
    resolution: Resolution = Resolution(3840, 2160)
    fps: float = 60.0
    duration_s: float = 60.0
    ramp_s: float = 10.0
    processes: int = 1
    token: str | None = None
    max_kbps: int | None = None
    decode_every: int = 30  # decode a keyframe at most once per this many frames; 0: never
    setup_timeout_s: float = 30.0  # request → first frame, else the stream failed
    min_fps: float | None = None
    max_p95_ms: float | None = None
    codec: str = "H264"  # the one codec each stream's offer holds
    # each stream drags the camera as a designer would (seeded per stream), so that the worker
    # renders every frame: a still camera only repeats at the worker's --idle-fps
    drag: bool = True
    seed: int = 0
    # lean: RTP counted straight from the decrypted datagram; full: through aiortc's receiver
    # (jitter buffer, depacketizer, NACK), as before; count: from the SRTP headers in the
    # clear, only the sampled keyframes decrypted
    receiver: str = "lean"
    decode: str = "keyframes"  # none, keyframes (sampled, see decode_every), all
    decoder: str = "auto"  # auto, cpu, nvdec
    # each stream sends transport-cc feedback as a browser does, so that the worker paces and
    # estimates the path as for browsers (lean: from the kernel's receive stamps; full)
    transport_feedback: bool = False
    # each harness process looks at its sockets at most this often (`wakes`); None: the
    # receiver's default, 5 ms for count (arrivals keep the kernel's stamps), 0 otherwise
    wake_interval_ms: float | None = None

    def __post_init__(self) -> None:
        if self.codec not in CODECS:
            raise ConfigError(f"--codec must be one of {', '.join(CODECS)}, not {self.codec!r}")
        if self.receiver not in RECEIVERS:
            raise ConfigError(f"--receiver must be lean, full or count, not {self.receiver!r}")
        if self.receiver == "count" and self.decode_mode == "all":
            raise ConfigError(
                "--receiver count decrypts only the keyframes it samples: --decode all needs "
                "--receiver lean or full"
            )
        if self.decode not in DECODE_MODES:
            raise ConfigError(
                f"--decode must be all, keyframes, every N or none, not {self.decode!r}"
            )
        if self.decoder not in DECODERS:
            raise ConfigError(f"--decoder must be auto, cpu or nvdec, not {self.decoder!r}")
        if not self.server.startswith(("http://", "https://")):
            raise ConfigError(f"--server must be an http(s):// URL, not {self.server!r}")
        if not 1 <= self.streams <= MAX_STREAMS:
            raise ConfigError(f"--streams must be 1..{MAX_STREAMS}, not {self.streams}")
        if not 1 <= self.processes <= MAX_PROCESSES:
            raise ConfigError(f"--processes must be 1..{MAX_PROCESSES}, not {self.processes}")
        if not 1 <= self.fps <= MAX_FPS:
            raise ConfigError(f"--fps must be 1..{MAX_FPS}, not {self.fps:g}")
        if not 0 < self.duration_s <= 24 * 3600:
            raise ConfigError(
                f"--duration must be a positive number of seconds, not {self.duration_s:g}"
            )
        if not 0 <= self.ramp_s <= 3600:
            raise ConfigError(f"--ramp must be 0..3600 seconds, not {self.ramp_s:g}")
        if self.decode_every < 0:
            raise ConfigError(
                f"--decode-every must be ≥ 0 (0: no decoding), not {self.decode_every}"
            )
        if self.max_kbps is not None and not 100 <= self.max_kbps <= 10_000_000:
            raise ConfigError(f"--max-kbps must be 100..10000000, not {self.max_kbps}")
        if self.setup_timeout_s <= 0:
            raise ConfigError("--setup-timeout must be positive")
        if self.min_fps is not None and self.min_fps < 0:
            raise ConfigError("--min-fps must be ≥ 0")
        if self.max_p95_ms is not None and self.max_p95_ms <= 0:
            raise ConfigError("--max-p95-ms must be positive")
        if self.wake_interval_ms is not None and not 0 <= self.wake_interval_ms <= MAX_WAKE_MS:
            raise ConfigError(
                f"--wake-interval-ms must be 0..{MAX_WAKE_MS:g}, not {self.wake_interval_ms:g}"
            )
        if self.wake_interval_s > 0 and self.receiver == "full":
            raise ConfigError(  # asyncio's datagram transport reads one datagram a wake
                "--wake-interval-ms needs --receiver lean or count: aiortc's receive path "
                "reads one datagram a wake"
            )

    @property
    def fps_floor(self) -> float:
        """The fps each stream must hold: --min-fps, else 95 % of the asked rate."""
        return self.min_fps if self.min_fps is not None else DEFAULT_MIN_FPS_SHARE * self.fps

    @property
    def wake_interval_s(self) -> float:
        """How long a harness process's loop holds its sockets' readiness (0: not at all)."""
        if self.wake_interval_ms is not None:
            return self.wake_interval_ms / 1000.0
        return COUNT_INTERVAL_S if self.receiver == "count" else 0.0

    @property
    def decode_mode(self) -> str:
        """What each stream decodes: `decode`, or none where `decode_every` is 0."""
        return self.decode if self.decode_every > 0 else "none"

    @property
    def hold_start_s(self) -> float:
        """Seconds after the run's start when the last stream has been asked for."""
        return self.ramp_s

    @property
    def end_s(self) -> float:
        return self.ramp_s + self.duration_s

    def start_offset_s(self, index: int) -> float:
        """When stream `index` asks for its session: evenly over the ramp, the first at 0."""
        return self.ramp_s * index / self.streams

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["resolution"] = f"{self.resolution.width}x{self.resolution.height}"
        out["token"] = "***" if self.token else None
        out["decode_mode"] = self.decode_mode
        out["wake_interval_ms"] = round(self.wake_interval_s * 1000.0, 3)
        return out
