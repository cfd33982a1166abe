"""Option groups shared by the commands, and the typed configs they build.

Every default comes from the config dataclasses (`config.py`), the one place they are written;
an option may also be set with RENDER_SERVER_<OPTION>, and a flag wins over the environment.
A default is given to argparse as text (the variable's, or the config's) and its `type=`
converts it, so that a malformed variable is a usage error that names the option.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, TypedDict

from render_server.cli.option_values import (
    codecs_value,
    env,
    env_list,
    env_unless_zero,
    flag,
    processes_value,
    read_secret,
    record_dir_value,
    signaling_urls,
)
from render_server.cli.scene_options import scene_fields
from render_server.config import (
    ENCODERS,
    LOG_FORMATS,
    LOG_LEVEL,
    NVENC_INPUTS,
    NVENC_PRESETS,
    PLAYOUT_DELAYS,
    RENDERERS,
    SEND_PATHS,
    Resolution,
    ServerConfig,
    StreamConfig,
    WorkerConfig,
    env_value,
)

SubParsers = Any  # argparse._SubParsersAction, which typeshed keeps private

STREAM = StreamConfig()
SERVER = ServerConfig()
WORKER = WorkerConfig()


def stream_options(p: argparse.ArgumentParser) -> None:
    s = STREAM
    g = p.add_argument_group("stream (the worker's)")
    g.add_argument(
        "--resolution", default=env("resolution", s.resolution), help="WIDTHxHEIGHT (%(default)s)"
    )
    g.add_argument(
        "--max-resolution", default=env("max_resolution", s.max_resolution),
        help="the largest WIDTHxHEIGHT a browser may ask for (%(default)s)",
    )  # fmt: skip
    g.add_argument("--fps", type=float, default=env("fps", s.fps), help="%(default)s")
    g.add_argument(
        "--bitrate", type=int, default=env_unless_zero("bitrate", int),
        help="bits per second (default: from resolution and fps)",
    )  # fmt: skip
    g.add_argument(
        "--renderer", choices=RENDERERS, default=env("renderer", s.renderer),
        help="auto: CUDA where pycuda and a GPU work, else the CPU rasterizer (%(default)s)",
    )  # fmt: skip
    g.add_argument(
        "--encoder", choices=ENCODERS, default=env("encoder", s.encoder),
        help="auto: NVENC where the GPU has it, else libx264; replay: a pre-encoded clip in a "
        "loop, for load tests (%(default)s)",
    )  # fmt: skip
    g.add_argument(
        "--codecs", default=env_value("codecs"),
        help="the codecs sessions may be sent in, comma-separated, of H264, VP8, AV1 "
        "(default: every one this worker has an encoder for); each session sends the first "
        "its browser offers",
    )  # fmt: skip
    g.add_argument(
        "--nvenc-preset", choices=NVENC_PRESETS, default=env("nvenc_preset", s.nvenc_preset),
        help="NVENC speed/quality preset, p1 fastest (%(default)s)",
    )  # fmt: skip
    g.add_argument(
        "--nvenc-input", choices=NVENC_INPUTS, default=env("nvenc_input", s.nvenc_input),
        help="CUDA renderer + NVENC: device: NVENC reads the frames where they were drawn, in "
        "GPU memory (PyAV >= 18); host: a copy in pinned host memory, uploaded again by FFmpeg "
        "(%(default)s; device falls back to host where it does not open)",
    )  # fmt: skip
    g.add_argument(
        "--intra-refresh", action="store_true", default=flag("intra_refresh") or s.intra_refresh,
        help="NVENC: refresh the picture in stripes instead of sending whole keyframes "
        "(another encoder logs encoder.intra_refresh_ignored at start and sends keyframes)",
    )  # fmt: skip
    g.add_argument(
        "--scene", type=Path, default=env_value("scene"),
        help="a glTF 2.0 (.glb/.gltf) or OBJ file (default: the built-in scene)",
    )  # fmt: skip
    g.add_argument(
        "--max-triangles", type=int,
        default=env("max_triangles", SERVER.max_scene_triangles),
        help="refuse scenes with more triangles (%(default)s)",
    )  # fmt: skip
    g.add_argument(
        "--max-scene-bytes", type=int, default=env("max_scene_bytes", SERVER.max_scene_bytes),
        help="refuse scene files larger than this (%(default)s)",
    )  # fmt: skip
    g.add_argument(
        "--slots", type=int, default=env("slots", SERVER.slots),
        help="concurrent sessions of the worker (%(default)s)",
    )  # fmt: skip
    g.add_argument(
        "--processes", default=env("processes", SERVER.processes), metavar="N|auto",
        help="serve the slots from N child processes, each with its own sessions, so that "
        "they use every core (auto: one per core, at most one per slot; %(default)s: this "
        "process alone)",
    )  # fmt: skip
    g.add_argument(
        "--animate", action="store_true", default=flag("animate") or s.animate,
        help="orbit the camera slowly on its own",
    )  # fmt: skip
    g.add_argument(
        "--idle-fps", type=float, default=env_unless_zero("idle_fps", float),
        help="repeat a still picture this often; input still starts a frame at once "
        "(default: half of --fps)",
    )  # fmt: skip
    g.add_argument(
        "--playout-delay", choices=PLAYOUT_DELAYS, default=env("playout_delay", s.playout_delay),
        help="what browsers are asked to do with frames (RTP playout-delay): low = their "
        "low-latency renderer, zero = show at once, off = their own smoothing (%(default)s)",
    )  # fmt: skip
    g.add_argument(
        "--send-path", choices=SEND_PATHS, default=env("send_path", s.send_path),
        help="paced = transport-cc congestion control, pacing and a NACK history of 1.5 s; "
        "stock = aiortc's own sender (REMB only, bursts, 128 packets), for comparison "
        "(%(default)s)",
    )  # fmt: skip
    g.add_argument(
        "--fec", choices=("on", "off"), default=env("fec", "on" if s.fec else "off"),
        help="forward error correction (ULPFEC in RED) on the paced send path while the path "
        "loses packets, where the browser offers it (%(default)s)",
    )  # fmt: skip
    g.add_argument(
        "--fec-copies", choices=("on", "off"),
        default=env("fec_copies", "on" if s.fec_copies else "off"),
        help="send FEC packets once more as RTX copies where the browser negotiated RTX for "
        "RED: every one for H.264, whose next frame a lost one holds, so that its frames get "
        "full protection; the last of a frame for VP8 and AV1 (%(default)s)",
    )  # fmt: skip
    g.add_argument(
        "--record-congestion", metavar="DIR",
        default=env_value("record_congestion"),
        help="write each paced session's congestion-controller inputs (transport feedback, "
        "packets sent) to DIR/<session>-<peer>.jsonl.gz (DIR made when missing), to replay "
        "in tests",
    )  # fmt: skip
    g.add_argument(
        "--max-viewers", type=int, default=env("max_viewers", s.max_viewers), metavar="N",
        help="viewers of each shared session, each sent the owner's encoded frames "
        "(0: sharing off; %(default)s)",
    )  # fmt: skip
    g.add_argument(
        "--connect-timeout", type=float, default=env("connect_timeout", s.connect_timeout_s),
        help="end a session whose browser has not connected its media in this long "
        "(at the start, or after its connection dropped) (%(default)s s)",
    )  # fmt: skip
    g.add_argument(
        "--idle-timeout", type=float, default=env("idle_timeout", s.idle_timeout_s or 0),
        help="end a controller's session after this many seconds without input; 0: never "
        "(%(default)s)",
    )  # fmt: skip
    g.add_argument(
        "--label", action="append", default=env_list("label"), metavar="NAME",
        help="a label browsers can require of the worker (repeatable)",
    )  # fmt: skip
    g.add_argument("--region", default=env_value("region"), help="the worker's region")


def lifecycle_options(p: argparse.ArgumentParser) -> None:
    """A worker process's drain, spot notice and status port (docs/operations.md)."""
    w = WORKER
    g = p.add_argument_group("drain, spot VMs and status (the worker's)")
    g.add_argument(
        "--drain-timeout", type=float, default=env("drain_timeout", w.drain_timeout_s),
        metavar="S",
        help="on SIGTERM, worker.drain or a spot notice the worker hands its sessions over "
        "and leaves when none is left, or after this long (%(default)s s)",
    )  # fmt: skip
    g.add_argument(
        "--preemption-url", default=env_value("preemption_url"), metavar="URL",
        help="a spot VM's interruption notice, polled: AWS's .../spot/instance-action or "
        "GCP's .../instance/preempted; a notice starts the drain (default: off)",
    )  # fmt: skip
    g.add_argument(
        "--preemption-poll", type=float, default=env("preemption_poll", w.preemption_poll_s),
        metavar="S", help="poll --preemption-url this often (%(default)s s)",
    )  # fmt: skip
    g.add_argument(
        "--metrics-port", type=int, default=env("metrics_port", w.metrics_port),
        help="serve /metrics, /healthz and /readyz on this port; 0: off (%(default)s)",
    )  # fmt: skip
    g.add_argument(
        "--metrics-host", default=env("metrics_host", w.metrics_host),
        help="the status port's address (%(default)s)",
    )  # fmt: skip


def signaling_options(p: argparse.ArgumentParser, default_host: str) -> None:
    c = SERVER
    g = p.add_argument_group("signaling")
    g.add_argument(
        "--host", default=env("host", default_host), help="address to bind (%(default)s)"
    )
    g.add_argument("--port", type=int, default=env("port", c.port), help="%(default)s")
    g.add_argument(
        "--tls-cert", type=Path, default=env_value("tls_cert"), metavar="FILE",
        help="serve HTTPS (and wss://) with this PEM certificate chain, without a proxy",
    )  # fmt: skip
    g.add_argument("--tls-key", type=Path, default=env_value("tls_key"), metavar="FILE",
                   help="the certificate's PEM private key")  # fmt: skip
    g.add_argument(
        "--registry", default=env_value("registry"), metavar="URL",
        help="redis://HOST:PORT/DB to share workers, sessions and the queue between "
        "replicas (default: in memory, one replica)",
    )  # fmt: skip
    g.add_argument(
        "--allow-origin", action="append", default=env_list("allow_origin"), metavar="URL",
        help="another page origin allowed to connect (repeatable)",
    )  # fmt: skip
    g.add_argument(
        "--ice-server", action="append", default=env_list("ice_server"), metavar="URL",
        help="a stun: server for both peers (repeatable; none on a LAN)",
    )  # fmt: skip
    g.add_argument(
        "--turn-url", action="append", default=env_list("turn_url"), metavar="URL",
        help="a turn:/turns: server; credentials are minted per session (repeatable)",
    )  # fmt: skip
    g.add_argument("--turn-secret", default=env_value("turn_secret"),
                   help="coturn's static-auth-secret (use-auth-secret); a flag shows in `ps`: "
                   "prefer --turn-secret-file or RENDER_SERVER_TURN_SECRET")  # fmt: skip
    g.add_argument("--turn-secret-file", type=Path, default=env_value("turn_secret_file"),
                   metavar="FILE", help="a file holding --turn-secret")  # fmt: skip
    g.add_argument("--turn-ttl", type=float, default=env("turn_ttl", c.turn_ttl_s),
                   help="lifetime of TURN credentials, seconds (%(default)s)")  # fmt: skip
    g.add_argument("--heartbeat-timeout", type=float,
                   default=env("heartbeat_timeout", c.heartbeat_timeout_s),
                   help="a worker silent this long is lost (%(default)s s)")  # fmt: skip
    g.add_argument(
        "--resume-grace", type=float, default=env("resume_grace", c.resume_grace_s),
        help="a dropped browser may resume its session this long (%(default)s s)",
    )  # fmt: skip
    g.add_argument(
        "--offer-timeout", type=float, default=env("offer_timeout", c.offer_timeout_s),
        help="end a session whose attached browser sent no offer this long after the session "
        "opened (or after the browser came back) (%(default)s s)",
    )  # fmt: skip
    g.add_argument(
        "--max-sessions-per-subject", type=int,
        default=env("max_sessions_per_subject", c.max_sessions_per_subject),
        help="sessions and queue places one token subject may hold at once, fleet-wide; "
        "0: no cap (%(default)s)",
    )  # fmt: skip
    g.add_argument(
        "--max-sessions-per-address", type=int,
        default=env("max_sessions_per_address", c.max_sessions_per_address),
        help="sessions and queue places one client address may hold at once, fleet-wide; "
        "0: no cap (%(default)s)",
    )  # fmt: skip
    connection_options(p)


def connection_options(p: argparse.ArgumentParser) -> None:
    c = SERVER
    g = p.add_argument_group("connections (against slow, idle and hoarding clients)")
    g.add_argument(
        "--header-timeout", type=float, default=env("header_timeout", c.header_timeout_s),
        help="close a connection that has not sent a request's headers in this long "
        "(%(default)s s)",
    )  # fmt: skip
    g.add_argument(
        "--keepalive-timeout", type=float,
        default=env("keepalive_timeout", c.keepalive_timeout_s),
        help="close an idle keep-alive connection after this long (%(default)s s)",
    )  # fmt: skip
    g.add_argument(
        "--max-connections-per-address", type=int,
        default=env("max_connections_per_address", c.max_connections_per_address),
        help="open connections (WebSockets included) of one TCP peer; behind a proxy or an "
        "ingress that peer is the proxy, so this caps all its clients together: raise it "
        "there (%(default)s)",
    )  # fmt: skip
    g.add_argument(
        "--max-connections", type=int, default=env("max_connections", c.max_connections),
        help="open connections in all; beyond, new ones are closed at once (%(default)s)",
    )  # fmt: skip
    g.add_argument(
        "--trusted-proxy", action="append", default=env_list("trusted_proxy"), metavar="CIDR",
        help="a proxy network whose X-Forwarded-For names the client, for the per-client "
        "limits and the audit log (repeatable; the connection cap still counts the proxy)",
    )  # fmt: skip


def auth_options(p: argparse.ArgumentParser, with_mode: bool = True) -> None:
    g = p.add_argument_group("authentication")
    if with_mode:
        g.add_argument(
            "--auth", choices=("auto", "on", "off"), default=env("auth", SERVER.auth),
            help="tokens required? auto: off only for serve on loopback (%(default)s)",
        )  # fmt: skip
    g.add_argument(
        "--secret", default=env_value("secret"),
        help="HS256 key of the tokens (≥ 32 bytes); a flag shows in `ps`: prefer "
        "--secret-file or RENDER_SERVER_SECRET",
    )  # fmt: skip
    g.add_argument("--secret-file", type=Path, default=env_value("secret_file"),
                   help="a file holding --secret (kept out of `ps` and shell history)")  # fmt: skip
    g.add_argument("--key-file", type=Path, default=env_value("key_file"),
                   help='a key set {"keys": {kid: secret}} for rotation')  # fmt: skip


def log_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--log-format", choices=LOG_FORMATS, default=env("log_format", SERVER.log_format)
    )
    p.add_argument("--log-level", default=env("log_level", LOG_LEVEL))


def stream_config(args: argparse.Namespace) -> StreamConfig:
    return StreamConfig(
        resolution=Resolution.parse(args.resolution),
        max_resolution=Resolution.parse(args.max_resolution),
        fps=args.fps,
        bitrate=args.bitrate,
        renderer=args.renderer,
        encoder=args.encoder,
        nvenc_preset=args.nvenc_preset,
        intra_refresh=args.intra_refresh,
        nvenc_input=args.nvenc_input,
        animate=args.animate,
        connect_timeout_s=args.connect_timeout,
        idle_timeout_s=args.idle_timeout or None,
        idle_fps=args.idle_fps,
        playout_delay=args.playout_delay,
        send_path=args.send_path,
        congestion_record_dir=record_dir_value(args.record_congestion),
        fec=args.fec == "on",
        fec_copies=args.fec_copies == "on",
        codecs=codecs_value(args.codecs),
        max_viewers=args.max_viewers,
    )


class WorkerFields(TypedDict, total=False):
    """What `ServerConfig` (serve's embedded worker) and `WorkerConfig` both say of a worker."""

    stream: StreamConfig
    scene: Path | None
    max_scene_triangles: int
    max_scene_bytes: int
    slots: int
    labels: tuple[str, ...]
    region: str | None
    processes: int


def worker_fields(args: argparse.Namespace) -> WorkerFields:
    """The worker's options (`stream_options`): what it streams, its scene and the limits on
    it, its slots, labels and region. Each config checks its own limits (slots: serve's
    embedded worker 1..64, a worker process 1..256)."""
    return WorkerFields(
        stream=stream_config(args), scene=args.scene, max_scene_triangles=args.max_triangles,
        max_scene_bytes=args.max_scene_bytes, slots=args.slots, labels=tuple(args.label),
        region=args.region, processes=processes_value(args.processes, args.slots),
    )  # fmt: skip


def server_config(args: argparse.Namespace, embedded_worker: bool = True) -> ServerConfig:
    """`serve` (with its embedded worker's stream options) or `signaling` (without)."""
    worker = worker_fields(args) if embedded_worker else WorkerFields()
    return ServerConfig(
        host=args.host,
        port=args.port,
        allowed_origins=tuple(o.rstrip("/") for o in args.allow_origin),
        ice_servers=tuple(args.ice_server),
        log_format=args.log_format,
        embedded_worker=embedded_worker,
        registry_url=args.registry,
        auth=args.auth,
        secret=read_secret(args.secret, args.secret_file, "--secret"),
        key_file=args.key_file,
        turn_urls=tuple(args.turn_url),
        turn_secret=read_secret(args.turn_secret, args.turn_secret_file, "--turn-secret"),
        turn_ttl_s=args.turn_ttl,
        heartbeat_timeout_s=args.heartbeat_timeout,
        resume_grace_s=args.resume_grace,
        offer_timeout_s=args.offer_timeout,
        max_sessions_per_subject=args.max_sessions_per_subject,
        max_sessions_per_address=args.max_sessions_per_address,
        header_timeout_s=args.header_timeout,
        keepalive_timeout_s=args.keepalive_timeout,
        max_connections_per_address=args.max_connections_per_address,
        max_connections=args.max_connections,
        trusted_proxies=tuple(args.trusted_proxy),
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        **worker,
        **scene_fields(args, with_max_bytes=not embedded_worker),
    )


def worker_config(args: argparse.Namespace) -> WorkerConfig:
    return WorkerConfig(
        signaling_urls=signaling_urls(args.signaling),
        drain_timeout_s=args.drain_timeout,
        preemption_url=args.preemption_url or None,
        preemption_poll_s=args.preemption_poll,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        token=read_secret(args.token, args.token_file, "--token"),
        secret=read_secret(args.secret, args.secret_file, "--secret"),
        key_file=args.key_file,
        worker_id=args.worker_id,
        ice_servers=tuple(args.ice_server),
        log_format=args.log_format,
        **worker_fields(args),
    )
