"""The `render-server` command line."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any

from render_server import __version__, logs
from render_server.config import (
    ENCODERS,
    NVENC_INPUTS,
    NVENC_PRESETS,
    PLAYOUT_DELAYS,
    RENDERERS,
    ConfigError,
    Resolution,
    ServerConfig,
    StreamConfig,
    WorkerConfig,
    env_value,
    parse_debug_delays,
)

DESCRIPTION = """\
Stream a rendered 3D scene to the browser over WebRTC.

  serve      one process: signaling, the web client and an embedded worker
  signaling  a signaling replica (no worker); several share a Redis registry
  worker     a worker process that registers with a signaling server
  token      mint an access token (JWT) for a worker, controller or viewer
  doctor     what this machine offers (CUDA, NVENC, libx264) and what auto picks
  bench      per-frame cost of each renderer/encoder pair
  latency    measure a running server's latency, stage by stage
  loadtest   many real WebRTC viewers against a server: what held, per stream

Every option can also be set with an environment variable RENDER_SERVER_<OPTION>
(e.g. RENDER_SERVER_PORT=9000, RENDER_SERVER_SECRET=...); a flag wins over the environment."""

SubParsers = Any  # argparse._SubParsersAction, which typeshed keeps private


def _env(name: str, fallback: str) -> str:
    return env_value(name) or fallback


def _flag(name: str) -> bool:
    return _env(name, "") in ("1", "true", "yes")


def _optional_float(name: str) -> float | None:
    text = _env(name, "")
    return float(text) if text else None


def _list(name: str) -> list[str]:
    return [item for item in _env(name, "").split(",") if item]


# -- option groups --------------------------------------------------------------------------------


def _stream_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("stream (the worker's)")
    g.add_argument(
        "--resolution", default=_env("resolution", "1280x720"), help="WIDTHxHEIGHT (%(default)s)"
    )
    g.add_argument(
        "--max-resolution", default=_env("max_resolution", "3840x2160"),
        help="the largest WIDTHxHEIGHT a browser may ask for (%(default)s)",
    )  # fmt: skip
    g.add_argument("--fps", type=float, default=float(_env("fps", "30")), help="%(default)s")
    g.add_argument(
        "--bitrate", type=int, default=int(_env("bitrate", "0")) or None,
        help="bits per second (default: from resolution and fps)",
    )  # fmt: skip
    g.add_argument(
        "--renderer", choices=RENDERERS, default=_env("renderer", "auto"),
        help="auto: CUDA where pycuda and a GPU work, else the CPU rasterizer (%(default)s)",
    )  # fmt: skip
    g.add_argument(
        "--encoder", choices=ENCODERS, default=_env("encoder", "auto"),
        help="auto: NVENC where the GPU has it, else libx264; replay: a pre-encoded clip in a "
        "loop, for load tests (%(default)s)",
    )  # fmt: skip
    g.add_argument(
        "--nvenc-preset", choices=NVENC_PRESETS, default=_env("nvenc_preset", "p1"),
        help="NVENC speed/quality preset, p1 fastest (%(default)s)",
    )  # fmt: skip
    g.add_argument(
        "--nvenc-input", choices=NVENC_INPUTS, default=_env("nvenc_input", "device"),
        help="CUDA renderer + NVENC: device: NVENC reads the frames where they were drawn, in "
        "GPU memory (PyAV >= 18); host: a copy in pinned host memory, uploaded again by FFmpeg "
        "(%(default)s; device falls back to host where it does not open)",
    )  # fmt: skip
    g.add_argument(
        "--intra-refresh", action="store_true", default=_flag("intra_refresh"),
        help="NVENC: refresh the picture in stripes instead of sending whole keyframes",
    )  # fmt: skip
    g.add_argument(
        "--scene", type=Path, default=env_value("scene"),
        help="a glTF 2.0 (.glb/.gltf) or OBJ file (default: the built-in scene)",
    )  # fmt: skip
    g.add_argument(
        "--max-triangles", type=int, default=int(_env("max_triangles", "2000000")),
        help="refuse scenes with more triangles (%(default)s)",
    )  # fmt: skip
    g.add_argument(
        "--max-scene-bytes", type=int, default=int(_env("max_scene_bytes", str(256 << 20))),
        help="refuse scene files larger than this (%(default)s)",
    )  # fmt: skip
    g.add_argument(
        "--slots", type=int, default=int(_env("slots", "2")),
        help="concurrent sessions of the worker (%(default)s)",
    )  # fmt: skip
    g.add_argument(
        "--animate", action="store_true", default=_flag("animate"),
        help="orbit the camera slowly on its own",
    )  # fmt: skip
    g.add_argument(
        "--idle-fps", type=float, default=_optional_float("idle_fps"),
        help="repeat a still picture this often; input still starts a frame at once "
        "(default: half of --fps)",
    )  # fmt: skip
    g.add_argument(
        "--playout-delay", choices=PLAYOUT_DELAYS, default=_env("playout_delay", "low"),
        help="what browsers are asked to do with frames (RTP playout-delay): low = their "
        "low-latency renderer, zero = show at once, off = their own smoothing (%(default)s)",
    )  # fmt: skip
    g.add_argument(
        "--connect-timeout", type=float, default=float(_env("connect_timeout", "20")),
        help="end a session whose browser has not connected its media in this long "
        "(at the start, or after its connection dropped) (%(default)s s)",
    )  # fmt: skip
    g.add_argument(
        "--idle-timeout", type=float, default=float(_env("idle_timeout", "600")),
        help="end a controller's session after this many seconds without input (%(default)s)",
    )  # fmt: skip
    g.add_argument(
        "--label", action="append", default=_list("label"), metavar="NAME",
        help="a label browsers can require of the worker (repeatable)",
    )  # fmt: skip
    g.add_argument("--region", default=env_value("region"), help="the worker's region")


def _signaling_options(p: argparse.ArgumentParser, default_host: str) -> None:
    g = p.add_argument_group("signaling")
    g.add_argument(
        "--host", default=_env("host", default_host), help="address to bind (%(default)s)"
    )
    g.add_argument("--port", type=int, default=int(_env("port", "8080")), help="%(default)s")
    g.add_argument(
        "--registry", default=env_value("registry"), metavar="URL",
        help="redis://HOST:PORT/DB to share workers, sessions and the queue between "
        "replicas (default: in memory, one replica)",
    )  # fmt: skip
    g.add_argument(
        "--allow-origin", action="append", default=_list("allow_origin"), metavar="URL",
        help="another page origin allowed to connect (repeatable)",
    )  # fmt: skip
    g.add_argument(
        "--ice-server", action="append", default=_list("ice_server"), metavar="URL",
        help="a stun: server for both peers (repeatable; none on a LAN)",
    )  # fmt: skip
    g.add_argument(
        "--turn-url", action="append", default=_list("turn_url"), metavar="URL",
        help="a turn:/turns: server; credentials are minted per session (repeatable)",
    )  # fmt: skip
    g.add_argument("--turn-secret", default=env_value("turn_secret"),
                   help="coturn's static-auth-secret (use-auth-secret)")  # fmt: skip
    g.add_argument("--turn-ttl", type=float, default=float(_env("turn_ttl", "3600")),
                   help="lifetime of TURN credentials, seconds (%(default)s)")  # fmt: skip
    g.add_argument("--heartbeat-timeout", type=float,
                   default=float(_env("heartbeat_timeout", "6")),
                   help="a worker silent this long is lost (%(default)s s)")  # fmt: skip
    g.add_argument(
        "--resume-grace", type=float, default=float(_env("resume_grace", "15")),
        help="a dropped browser may resume its session this long (%(default)s s)",
    )  # fmt: skip


def _auth_options(p: argparse.ArgumentParser, with_mode: bool = True) -> None:
    g = p.add_argument_group("authentication")
    if with_mode:
        g.add_argument(
            "--auth", choices=("auto", "on", "off"), default=_env("auth", "auto"),
            help="tokens required? auto: off only for serve on loopback (%(default)s)",
        )  # fmt: skip
    g.add_argument(
        "--secret", default=env_value("secret"),
        help="HS256 key of the tokens (≥ 32 bytes); prefer RENDER_SERVER_SECRET",
    )  # fmt: skip
    g.add_argument("--key-file", type=Path, default=env_value("key_file"),
                   help='a key set {"keys": {kid: secret}} for rotation')  # fmt: skip


def _log_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--log-format", choices=("text", "json"), default=_env("log_format", "text"))
    p.add_argument("--log-level", default=_env("log_level", "INFO"))


def _stream_config(args: argparse.Namespace) -> StreamConfig:
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
        debug_delays_ms=parse_debug_delays(_env("debug_delay_ms", "")),
    )


def serve_config(args: argparse.Namespace, embedded_worker: bool = True) -> ServerConfig:
    stream = _stream_config(args) if embedded_worker else StreamConfig()
    return ServerConfig(
        host=args.host,
        port=args.port,
        stream=stream,
        scene=getattr(args, "scene", None),
        max_scene_triangles=getattr(args, "max_triangles", 2_000_000),
        max_scene_bytes=getattr(args, "max_scene_bytes", 256 << 20),
        slots=getattr(args, "slots", 2),
        labels=tuple(getattr(args, "label", ())),
        region=getattr(args, "region", None),
        allowed_origins=tuple(o.rstrip("/") for o in args.allow_origin),
        ice_servers=tuple(args.ice_server),
        log_format=args.log_format,
        embedded_worker=embedded_worker,
        registry_url=args.registry,
        auth=args.auth,
        secret=args.secret,
        key_file=args.key_file,
        turn_urls=tuple(args.turn_url),
        turn_secret=args.turn_secret,
        turn_ttl_s=args.turn_ttl,
        heartbeat_timeout_s=args.heartbeat_timeout,
        resume_grace_s=args.resume_grace,
    )


# -- commands -------------------------------------------------------------------------------------


def _add_serve(sub: SubParsers) -> None:
    p = sub.add_parser(
        "serve",
        help="run the signaling server, the web client and one embedded worker in one process",
        description="Run the signaling server, serve the web client and stream from one "
        "embedded worker. Open the printed URL in Chromium or Firefox. On a loopback address "
        "no token is needed; anywhere else, set --secret (or RENDER_SERVER_SECRET).",
    )
    _signaling_options(p, "127.0.0.1")
    _auth_options(p)
    _stream_options(p)
    _log_options(p)
    p.set_defaults(func=_serve, embedded=True)


def _add_signaling(sub: SubParsers) -> None:
    p = sub.add_parser(
        "signaling",
        help="run a signaling replica: browsers and workers meet here (no worker of its own)",
        description="A signaling replica: pairs browsers with the slots of registered workers, "
        "queues them fairly when every slot is busy, relays their negotiation. Several "
        "replicas behind a load balancer share one --registry redis://... Tokens are required "
        "(--secret or RENDER_SERVER_SECRET) unless --auth off.",
    )
    _signaling_options(p, "0.0.0.0")
    _auth_options(p)
    _log_options(p)
    p.set_defaults(func=_serve, embedded=False)


def _serve(args: argparse.Namespace) -> int:
    from render_server.cli.serve import run_server

    config = serve_config(args, embedded_worker=args.embedded)
    logs.configure(args.log_level.upper(), config.log_format)
    return _run_process(run_server(config))


def _run_process(main: Coroutine[Any, Any, None]) -> int:
    """Run a server process; what stops it at start is one line on stderr and exit code 2."""
    from render_server.backends.choice import BackendUnavailable
    from render_server.cli.serve import ListenError
    from render_server.render.scene import SceneError

    try:
        asyncio.run(main)
    except SceneError as exc:
        print(f"render-server: cannot load the scene: {exc}", file=sys.stderr)
        return 2
    except (BackendUnavailable, ListenError, ConnectionError, ValueError) as exc:
        # a backend that cannot run, a taken port, an unreachable Redis, a bad key
        print(f"render-server: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


def _add_worker(sub: SubParsers) -> None:
    p = sub.add_parser(
        "worker",
        help="run a worker that registers with a signaling server and serves its sessions",
        description="A worker process: registers with the signaling server over a WebSocket "
        "(its capabilities: GPU, renderer, encoders, slots, labels), sends heartbeats and "
        "streams the sessions placed on it. Reconnects with backoff.",
    )
    p.add_argument(
        "--signaling", default=_env("signaling", "ws://127.0.0.1:8080/worker"), metavar="URL",
        help="the signaling server's worker socket (%(default)s)",
    )  # fmt: skip
    p.add_argument("--token", default=env_value("token"),
                   help="a worker token (else one is minted from --secret/--key-file)")  # fmt: skip
    p.add_argument("--worker-id", default=_env("worker_id", ""), help="default: host and pid")
    p.add_argument(
        "--ice-server", action="append", default=_list("ice_server"), metavar="URL",
        help="a stun: server (repeatable)",
    )  # fmt: skip
    _auth_options(p, with_mode=False)
    _stream_options(p)
    _log_options(p)
    p.set_defaults(func=_worker)


def worker_config(args: argparse.Namespace) -> WorkerConfig:
    return WorkerConfig(
        signaling_url=args.signaling,
        token=args.token,
        secret=args.secret,
        key_file=args.key_file,
        worker_id=args.worker_id,
        slots=args.slots,
        stream=_stream_config(args),
        scene=args.scene,
        max_scene_triangles=args.max_triangles,
        max_scene_bytes=args.max_scene_bytes,
        labels=tuple(args.label),
        region=args.region,
        ice_servers=tuple(args.ice_server),
        log_format=args.log_format,
    )


def _worker(args: argparse.Namespace) -> int:
    from render_server.cli.serve import run_worker

    config = worker_config(args)
    logs.configure(args.log_level.upper(), config.log_format)
    return _run_process(run_worker(config))


def _add_token(sub: SubParsers) -> None:
    p = sub.add_parser(
        "token",
        help="mint an access token (JWT) for a worker, controller or viewer",
        description="Print a signed token. Browsers pass it to the SDK (`token`), which sends it "
        "as the WebSocket subprotocol bearer.<token>; programs send Authorization: Bearer.",
    )
    p.add_argument("--role", choices=("worker", "controller", "viewer"), required=True)
    p.add_argument("--subject", help="who the token stands for (default: a random id)")
    p.add_argument("--ttl", type=float, default=3600.0, help="seconds (%(default)s)")
    p.add_argument("--kid", help="which key of --key-file signs it")
    _auth_options(p, with_mode=False)
    p.set_defaults(func=_token)


def _token(args: argparse.Namespace) -> int:
    from render_server.signaling.auth import Authenticator, load_keys

    try:
        auth = Authenticator(load_keys(args.secret, args.key_file))
        print(auth.mint(args.role, args.subject, args.ttl, args.kid))
    except (ValueError, KeyError) as exc:
        print(f"render-server: {exc}", file=sys.stderr)
        return 2
    return 0


def _add_doctor(sub: SubParsers) -> None:
    p = sub.add_parser(
        "doctor",
        help="say what this machine offers: CUDA, NVENC per codec, libx264, what auto picks",
        description="Probe CUDA (through pycuda), NVENC for H.264, HEVC and AV1 (by opening an "
        "encoder), libx264, say which renderer and encoder `auto` picks and why, and time each "
        "available backend for a few seconds.",
    )
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.add_argument(
        "--seconds", type=float, default=3.0, help="per benchmark; 0 skips them (%(default)s)"
    )
    p.set_defaults(func=_doctor)


def _doctor(args: argparse.Namespace) -> int:
    import json
    import logging

    from render_server.backends.doctor import diagnose, format_report

    logging.getLogger("render_server").setLevel(logging.ERROR)  # the report says it all
    report = diagnose(max(0.0, args.seconds))
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0


def _add_bench(sub: SubParsers) -> None:
    p = sub.add_parser(
        "bench",
        help="time render and encode per frame for each available backend",
        description="For each renderer/encoder pair this machine runs, time one session's whole "
        "frame path (render, convert, encode) with the camera moving every frame, and the "
        "frames per second one process sustains that way.",
    )
    p.add_argument("--resolutions", default="1280x720,1920x1080,3840x2160")
    p.add_argument("--seconds", type=float, default=3.0, help="per measurement (%(default)s)")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.set_defaults(func=_bench)


def _bench(args: argparse.Namespace) -> int:
    import json
    import logging

    from render_server.backends.bench import bench_pipeline
    from render_server.backends.choice import Backends, choose_backends
    from render_server.render.scene import default_scene

    logging.getLogger("render_server").setLevel(logging.ERROR)
    resolutions = [Resolution.parse(r) for r in args.resolutions.split(",")]
    auto = choose_backends("auto", "auto")
    pairs = {("cpu", "x264"), (auto.renderer, auto.encoder)}
    pairs |= {(auto.renderer, "x264"), ("cpu", auto.encoder)}
    scene = default_scene()
    results = []
    variants = []
    for renderer, encoder in sorted(pairs):
        for nvenc_input in (
            ("host", "device") if (renderer, encoder) == ("cuda", "nvenc") else ("host",)
        ):
            variants.append(
                Backends(renderer, encoder, "bench", "bench", encoder, auto.gpu, nvenc_input)
            )
    for backends in variants:
        for resolution in resolutions:
            measured = bench_pipeline(scene, backends, resolution, args.seconds).as_dict()
            results.append(measured)
            if not args.json:
                stages = ", ".join(f"{k} {v:.2f}" for k, v in measured["stages_ms"].items())
                print(
                    f"{measured['what']:<22} {measured['resolution']:>9}  {stages}  "
                    f"-> {measured['fps']:.1f} fps sustained"
                )
    if args.json:
        print(json.dumps({"scene_triangles": scene.triangle_count, "results": results}, indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="render-server",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in (_add_serve, _add_signaling, _add_worker, _add_token, _add_doctor, _add_bench):
        add(sub)
    from render_server.cli.latency import add_latency

    add_latency(sub)
    from render_server.cli.loadtest import add_loadtest

    add_loadtest(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        return int(args.func(args))
    except ConfigError as exc:
        parser.error(str(exc))
    except ValueError as exc:  # a malformed number in an environment variable
        parser.error(str(exc))
    return 2


if __name__ == "__main__":
    sys.exit(main())
