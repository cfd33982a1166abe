"""Typed configuration: the one place the CLI, environment variables and tests go through."""

from __future__ import annotations

import ipaddress
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from render_server.protocol.requirements import MAX_HEIGHT, MAX_WIDTH

ENV_PREFIX = "RENDER_SERVER_"
PACKAGE_DIR = Path(__file__).resolve().parent

RendererName = Literal["auto", "cuda", "cpu"]
EncoderName = Literal["auto", "nvenc", "x264", "replay"]
RENDERERS: tuple[RendererName, ...] = ("auto", "cuda", "cpu")
ENCODERS: tuple[EncoderName, ...] = ("auto", "nvenc", "x264", "replay")
NVENC_PRESETS = ("p1", "p2", "p3", "p4", "p5", "p6", "p7")
NvencInput = Literal["device", "host"]
PlayoutDelay = Literal["low", "zero", "off"]  # see transport/playout_delay.py
PLAYOUT_DELAYS: tuple[PlayoutDelay, ...] = ("low", "zero", "off")
SendPathName = Literal["paced", "stock"]  # see transport/send_path.py
SEND_PATHS: tuple[SendPathName, ...] = ("paced", "stock")
NVENC_INPUTS: tuple[NvencInput, ...] = ("device", "host")
LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")
LOG_LEVEL = "INFO"  # every server command's --log-level, unless set

# H.264 needs even sizes for 4:2:0; the upper bound (MAX_WIDTH x MAX_HEIGHT, the protocol's own)
# is H.264 level 6.2's largest frame.
MIN_SIDE = 64
MAX_FPS = 240
# shared by `serve` (its embedded worker) and `worker`
DEFAULT_SLOTS = 2
MAX_PROCESSES = 64  # a worker's child processes (`--processes`)
MAX_SCENE_TRIANGLES = 2_000_000
MAX_SCENE_BYTES = 256 * 1024 * 1024
HEARTBEAT_S = 1.0  # a frozen worker is found within the timeout: 3 beats
# uploaded scenes (signaling/scene_store.py): kept a week, 1 GiB and 20 scenes per owner
SCENE_RETENTION_S = 7 * 24 * 3600.0
MAX_SCENE_RETENTION_S = 366 * 24 * 3600.0
SCENE_QUOTA_BYTES = 1024**3
MAX_SCENES_PER_OWNER = 20
MAX_VIEWERS = 64  # of one shared session: each is a peer connection the worker sends to
DRAIN_TIMEOUT_S = 100.0  # a worker's drain: inside a spot VM's two-minute notice


class ConfigError(ValueError):
    """A configuration value that cannot be used, with a message for the operator."""


@dataclass(frozen=True, order=True)
class Resolution:
    width: int
    height: int

    def __post_init__(self) -> None:
        if not (MIN_SIDE <= self.width <= MAX_WIDTH and MIN_SIDE <= self.height <= MAX_HEIGHT):
            raise ConfigError(
                f"resolution {self.width}x{self.height} is outside "
                f"{MIN_SIDE}x{MIN_SIDE}..{MAX_WIDTH}x{MAX_HEIGHT}"
            )
        if self.width % 2 or self.height % 2:
            raise ConfigError(f"resolution {self.width}x{self.height} must have even sides (4:2:0)")

    @classmethod
    def parse(cls, text: str) -> Resolution:
        match = re.fullmatch(r"\s*(\d{2,5})\s*[xX×]\s*(\d{2,5})\s*", text)
        if not match:
            raise ConfigError(f"resolution {text!r} is not WIDTHxHEIGHT, e.g. 1280x720")
        return cls(int(match.group(1)), int(match.group(2)))

    @property
    def pixels(self) -> int:
        return self.width * self.height

    def __str__(self) -> str:
        return f"{self.width}x{self.height}"


def default_bitrate(resolution: Resolution, fps: float) -> int:
    """Bits per second for a resolution and frame rate.

    About 0.1 bit per pixel per frame at 30 fps, growing with the square root of the frame rate
    (motion between close frames is cheaper); clamped to what a LAN and a browser decoder handle.
    """
    bits = 0.1 * resolution.pixels * 30.0 * (fps / 30.0) ** 0.5
    return int(min(max(bits, 1_000_000), 60_000_000))


@dataclass(frozen=True)
class StreamConfig:
    """What every session of a worker renders and sends."""

    resolution: Resolution = Resolution(1280, 720)
    max_resolution: Resolution = Resolution(3840, 2160)  # the most a browser may ask for
    fps: float = 30.0
    bitrate: int | None = None  # None: default_bitrate(resolution, fps)
    renderer: RendererName = "auto"
    encoder: EncoderName = "auto"
    nvenc_preset: str = "p1"
    intra_refresh: bool = False  # NVENC: refresh in stripes instead of whole IDRs
    # CUDA renderer + NVENC: NVENC reads the frames in GPU memory ("device"), or from a copy in
    # pinned host memory that FFmpeg uploads again ("host")
    nvenc_input: NvencInput = "device"
    animate: bool = False
    keyframe_min_interval_s: float = 0.25
    connect_timeout_s: float = 20.0  # session start → media connected, or the slot is freed
    idle_timeout_s: float | None = 600.0  # a controller's session ends after this without input
    idle_fps: float | None = None  # repeats of a still picture; None: half of `fps`
    # the RTP playout-delay the browser is asked for: low (its low-latency renderer), zero
    # (show at once), off (its own smoothing); see transport/playout_delay.py
    playout_delay: PlayoutDelay = "low"
    # the codecs the worker may send, in the order it prefers them where a browser ranks none
    # (encode/codecs.py); None: every codec it has an encoder for
    codecs: tuple[str, ...] | None = None
    # paced: transport-cc congestion control, a pacer and a NACK history sized by time;
    # stock: aiortc's own sender (REMB, bursts, 128 packets of history), the baseline
    send_path: SendPathName = "paced"
    # a folder where each paced session's congestion-controller inputs are written
    # (<session>-<peer>.jsonl.gz), for replaying real sessions in tests; None: not recorded
    congestion_record_dir: str | None = None
    # forward error correction (ULPFEC in RED) on the paced path, where the browser offers it
    # and the path loses packets (transport/fec_path.py)
    fec: bool = True
    # FEC packets sent once more as RTX copies where RTX for RED was negotiated (H.264: each;
    # else a frame's last), see transport/fec_path.py
    fec_copies: bool = True
    # viewers of each shared session (docs/sharing.md); 0: sharing off
    max_viewers: int = 8

    def __post_init__(self) -> None:
        if self.send_path not in SEND_PATHS:
            raise ConfigError(f"send path {self.send_path!r} is not paced or stock")
        if self.playout_delay not in PLAYOUT_DELAYS:
            raise ConfigError(f"playout delay {self.playout_delay!r} is not low, zero or off")
        if self.idle_fps is not None and not (0.5 <= self.idle_fps <= MAX_FPS):
            raise ConfigError(f"idle fps {self.idle_fps} is outside 0.5..{MAX_FPS}")
        if (
            self.max_resolution.width < self.resolution.width
            or self.max_resolution.height < self.resolution.height
        ):
            raise ConfigError(
                f"max resolution {self.max_resolution} is smaller than resolution {self.resolution}"
            )
        if not (1.0 <= self.fps <= MAX_FPS):
            raise ConfigError(f"fps {self.fps} is outside 1..{MAX_FPS}")
        if self.bitrate is not None and not (100_000 <= self.bitrate <= 200_000_000):
            raise ConfigError(f"bitrate {self.bitrate} is outside 100 kbit/s..200 Mbit/s")
        if self.renderer not in RENDERERS:
            raise ConfigError(f"renderer {self.renderer!r} is not one of {', '.join(RENDERERS)}")
        if self.idle_timeout_s is not None and not (1 <= self.idle_timeout_s <= 86400):
            raise ConfigError(f"idle timeout {self.idle_timeout_s}s is outside 1..86400")
        if not (0.1 <= self.connect_timeout_s <= 600):
            raise ConfigError(f"connect timeout {self.connect_timeout_s}s is outside 0.1..600")
        if self.encoder not in ENCODERS:
            raise ConfigError(f"encoder {self.encoder!r} is not one of {', '.join(ENCODERS)}")
        if self.nvenc_preset not in NVENC_PRESETS:
            raise ConfigError(f"NVENC preset {self.nvenc_preset!r} is not one of p1..p7")
        if self.nvenc_input not in NVENC_INPUTS:
            raise ConfigError(f"NVENC input {self.nvenc_input!r} is not device or host")
        if not 0 <= self.max_viewers <= MAX_VIEWERS:
            raise ConfigError(f"max viewers {self.max_viewers} is outside 0..{MAX_VIEWERS}")
        if self.codecs is not None and not self.codecs:
            raise ConfigError("codecs, where given, name at least one codec")

    @property
    def target_bitrate(self) -> int:
        return self.bitrate_for(self.resolution, self.fps)

    def bitrate_for(self, resolution: Resolution, fps: float) -> int:
        """The bitrate of a stream of this size and rate: `--bitrate` where the operator set
        one (a budget per stream, whatever its size), else scaled to the pixels and rate."""
        return self.bitrate if self.bitrate is not None else default_bitrate(resolution, fps)


AuthMode = Literal["auto", "on", "off"]


@dataclass(frozen=True)
class ServerConfig:
    """A signaling replica (`render-server signaling`), with an embedded worker for `serve`."""

    host: str = "127.0.0.1"
    port: int = 8080
    stream: StreamConfig = field(default_factory=StreamConfig)
    scene: Path | None = None  # None: the built-in default scene
    max_scene_triangles: int = MAX_SCENE_TRIANGLES
    max_scene_bytes: int = MAX_SCENE_BYTES
    slots: int = DEFAULT_SLOTS
    processes: int = 1  # child processes serving the slots (`--processes`); 1: this one
    allowed_origins: tuple[str, ...] = ()  # besides the server's own origin
    ice_servers: tuple[str, ...] = ()  # stun: URLs handed to both peers
    client_dir: Path = PACKAGE_DIR / "client"  # the web client, served at /client/
    log_format: LogFormat = "text"
    embedded_worker: bool = True  # serve: yes; signaling: no
    labels: tuple[str, ...] = ()  # of the embedded worker
    region: str | None = None
    registry_url: str | None = None  # None: in memory (one replica); redis://...: shared
    auth: AuthMode = "auto"  # auto: off for serve on loopback, on everywhere else
    secret: str | None = field(default=None, repr=False)
    key_file: Path | None = None
    turn_urls: tuple[str, ...] = ()
    turn_secret: str | None = field(default=None, repr=False)
    turn_ttl_s: float = 3600.0
    heartbeat_s: float = HEARTBEAT_S  # workers beat this often ...
    heartbeat_timeout_s: float = 3.0  # ... and are lost after this long without one
    resume_grace_s: float = 15.0  # a dropped browser socket may come back this long
    open_timeout_s: float = 15.0  # a worker must open a placed session within this
    # an attached browser must offer within this once its session is open, or the slot is freed
    offer_timeout_s: float = 8.0
    # sessions and queue places held at once, fleet-wide, per token subject and per client
    # address (0: no cap); with authentication off only the per-address cap applies
    max_sessions_per_subject: int = 24
    max_sessions_per_address: int = 48
    replica_id: str = ""  # "" : hostname and process id
    # the connection level (signaling/connection_limits.py): slowloris, idle and hoarded sockets
    header_timeout_s: float = 10.0  # a connection completes a request's headers within this
    keepalive_timeout_s: float = 15.0  # an idle keep-alive connection is closed after this
    max_connections_per_address: int = 64  # open connections of one TCP peer (a proxy: all)
    max_connections: int = 4096  # open connections in all
    # networks of proxies whose X-Forwarded-For names the client (edge.client_address)
    trusted_proxies: tuple[str, ...] = ()
    tls_cert: Path | None = None  # HTTPS and wss:// without a proxy: a PEM chain and its key
    tls_key: Path | None = None
    # designers' uploads (signaling/scene_api.py), each at most `max_scene_bytes`; None: no
    # uploads (the command line always gives a folder: default_scene_dir())
    scene_dir: Path | None = None
    scene_retention_s: float = SCENE_RETENTION_S
    scene_quota_bytes: int = SCENE_QUOTA_BYTES  # all of one owner's scenes together
    max_scenes_per_owner: int = MAX_SCENES_PER_OWNER

    def __post_init__(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("--tls-cert and --tls-key go together")
        if not (0 <= self.port <= 65535):
            raise ConfigError(f"port {self.port} is outside 0..65535")
        if not (1 <= self.slots <= 64):
            raise ConfigError(f"slots {self.slots} is outside 1..64")
        check_processes(self.processes, self.slots)
        if self.registry_url is not None and not re.match(r"rediss?://", self.registry_url):
            raise ConfigError(f"registry {self.registry_url!r} is not a redis:// URL")
        if self.turn_urls and not self.turn_secret:
            raise ConfigError("TURN URLs need --turn-secret (coturn's use-auth-secret)")
        for url in self.turn_urls:
            if not re.fullmatch(r"turns?:\S+", url):
                raise ConfigError(f"TURN server {url!r} is not a turn:/turns: URL")
        if not (0.1 <= self.offer_timeout_s <= 600):
            raise ConfigError(f"offer timeout {self.offer_timeout_s}s is outside 0.1..600")
        for name in ("max_sessions_per_subject", "max_sessions_per_address"):
            cap = getattr(self, name)
            if not (0 <= cap <= 1_000_000):
                raise ConfigError(f"{name.replace('_', ' ')} {cap} is outside 0..1000000")
        if not (0.2 <= self.heartbeat_s < self.heartbeat_timeout_s):
            raise ConfigError("the heartbeat timeout must be longer than the heartbeat")
        for origin in self.allowed_origins:
            if not re.fullmatch(r"https?://[^/\s]+", origin):
                raise ConfigError(f"allowed origin {origin!r} is not scheme://host[:port]")
        for url in self.ice_servers:
            if not re.fullmatch(r"(stun|stuns|turn|turns):\S+", url):
                raise ConfigError(f"ICE server {url!r} is not a stun:/turn: URL")
        self._check_connection_limits()
        self._check_scene_limits()

    def _check_scene_limits(self) -> None:
        if not (1 <= self.max_scene_bytes <= 1 << 40):
            raise ConfigError(f"max scene bytes {self.max_scene_bytes} is outside 1..2^40")
        if not (1 <= self.scene_retention_s <= MAX_SCENE_RETENTION_S):
            raise ConfigError(
                f"scene retention {self.scene_retention_s:g}s is outside "
                f"1..{MAX_SCENE_RETENTION_S:.0f} (a year)"
            )
        if not (1 <= self.scene_quota_bytes <= 1 << 50):
            raise ConfigError(f"scene quota {self.scene_quota_bytes} bytes is outside 1..2^50")
        if not (1 <= self.max_scenes_per_owner <= 10_000):
            raise ConfigError(
                f"max scenes per owner {self.max_scenes_per_owner} is outside 1..10000"
            )

    def _check_connection_limits(self) -> None:
        if not (0.1 <= self.header_timeout_s <= 3600):
            raise ConfigError(f"header timeout {self.header_timeout_s}s is outside 0.1..3600")
        if not (0.1 <= self.keepalive_timeout_s <= 3600):
            raise ConfigError(
                f"keep-alive timeout {self.keepalive_timeout_s}s is outside 0.1..3600"
            )
        if not (1 <= self.max_connections <= 1_000_000):
            raise ConfigError(f"max connections {self.max_connections} is outside 1..1000000")
        if not (1 <= self.max_connections_per_address <= self.max_connections):
            raise ConfigError(
                f"max connections per address {self.max_connections_per_address} is outside "
                f"1..{self.max_connections} (--max-connections)"
            )
        for network in self.trusted_proxies:
            try:
                ipaddress.ip_network(network, strict=False)
            except ValueError:
                raise ConfigError(
                    f"trusted proxy {network!r} is not an address or CIDR network"
                ) from None

    @property
    def auth_required(self) -> bool:
        if self.auth != "auto":
            return self.auth == "on"
        from render_server.signaling.origin import is_loopback

        return not (self.embedded_worker and is_loopback(self.host))


@dataclass(frozen=True)
class WorkerConfig:
    """`render-server worker`: a worker process that registers with a signaling server."""

    signaling_url: str = "ws://127.0.0.1:8080/worker"
    token: str | None = field(default=None, repr=False)
    secret: str | None = field(default=None, repr=False)  # to mint its own worker token
    key_file: Path | None = None
    worker_id: str = ""  # "": hostname and process id
    slots: int = DEFAULT_SLOTS
    processes: int = 1  # child processes serving the slots (`--processes`); 1: this one
    stream: StreamConfig = field(default_factory=StreamConfig)
    scene: Path | None = None
    max_scene_triangles: int = MAX_SCENE_TRIANGLES
    max_scene_bytes: int = MAX_SCENE_BYTES
    labels: tuple[str, ...] = ()
    region: str | None = None
    ice_servers: tuple[str, ...] = ()
    heartbeat_s: float = HEARTBEAT_S
    log_format: LogFormat = "text"
    # signaling replicas tried in turn (failover); empty: `signaling_url` alone, which is
    # otherwise the first of them
    signaling_urls: tuple[str, ...] = ()
    drain_timeout_s: float = DRAIN_TIMEOUT_S  # a drain's deadline (SIGTERM, worker.drain)
    preemption_url: str | None = None  # a spot/preemptible VM's notice endpoint, polled
    preemption_poll_s: float = 5.0
    metrics_port: int = 0  # the status port (/metrics, /healthz, /readyz); 0: none
    metrics_host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        urls = self.signaling_urls or (self.signaling_url,)
        object.__setattr__(self, "signaling_urls", tuple(urls))
        object.__setattr__(self, "signaling_url", urls[0])
        for url in urls:
            if not re.match(r"wss?://", url):
                raise ConfigError(f"signaling URL {url!r} is not ws:// or wss://")
        if not (1 <= self.slots <= 256):
            raise ConfigError(f"slots {self.slots} is outside 1..256")
        check_processes(self.processes, self.slots)
        if not (0 <= self.drain_timeout_s <= 3600):
            raise ConfigError(f"drain timeout {self.drain_timeout_s}s is outside 0..3600")
        if self.preemption_url is not None and not re.match(r"https?://", self.preemption_url):
            raise ConfigError(f"preemption URL {self.preemption_url!r} is not http(s)://")
        if not (0.1 <= self.preemption_poll_s <= 3600):
            raise ConfigError(f"preemption poll {self.preemption_poll_s}s is outside 0.1..3600")
        if not (0 <= self.metrics_port <= 65535):
            raise ConfigError(f"metrics port {self.metrics_port} is outside 0..65535")


def default_scene_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where uploads are kept unless told: $XDG_STATE_HOME/render-server/scenes, else
    ~/.local/state/render-server/scenes (a user's state, kept across restarts)."""
    env = os.environ if environ is None else environ
    state = env.get("XDG_STATE_HOME")
    if not state or not os.path.isabs(state):  # the spec: a relative value is ignored
        try:
            state = str(Path.home() / ".local" / "state")
        except RuntimeError:  # no home (a container's arbitrary user): a folder of its own
            state = str(Path(tempfile.gettempdir()) / f"render-server-{os.getuid()}")
    return Path(state) / "render-server" / "scenes"


def check_processes(processes: int, slots: int) -> None:
    """A worker's child processes: each serves at least one slot."""
    if not (1 <= processes <= MAX_PROCESSES):
        raise ConfigError(f"processes {processes} is outside 1..{MAX_PROCESSES}")
    if processes > slots:
        raise ConfigError(f"{processes} processes for {slots} slots: each serves one at least")


def env_value(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The value of RENDER_SERVER_<NAME>, or None."""
    env = os.environ if environ is None else environ
    value = env.get(ENV_PREFIX + name.upper())
    return value if value not in (None, "") else None
