"""The `render-server` command line."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

from . import __version__, logs
from .config import (
    ENCODERS,
    NVENC_PRESETS,
    RENDERERS,
    ConfigError,
    Resolution,
    ServerConfig,
    StreamConfig,
    env_value,
)

DESCRIPTION = """\
Stream a rendered 3D scene to the browser over WebRTC.

Every option can also be set with an environment variable RENDER_SERVER_<OPTION>
(e.g. RENDER_SERVER_PORT=9000); a command-line flag wins over the environment."""


def _env(name: str, fallback: str) -> str:
    return env_value(name) or fallback


def _add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="run the signaling server, the web client and one embedded worker in one process",
        description="Run the signaling server, serve the web client and stream from one "
        "embedded worker (in-memory registry). Open the printed URL in Chromium or Firefox.",
    )
    p.add_argument(
        "--host", default=_env("host", "127.0.0.1"), help="address to bind (%(default)s)"
    )
    p.add_argument("--port", type=int, default=int(_env("port", "8080")), help="%(default)s")
    p.add_argument(
        "--resolution", default=_env("resolution", "1280x720"), help="WIDTHxHEIGHT (%(default)s)"
    )
    p.add_argument("--fps", type=float, default=float(_env("fps", "30")), help="%(default)s")
    p.add_argument(
        "--bitrate",
        type=int,
        default=int(_env("bitrate", "0")) or None,
        help="bits per second (default: from resolution and fps)",
    )
    p.add_argument(
        "--renderer",
        choices=RENDERERS,
        default=_env("renderer", "auto"),
        help="auto: CUDA where pycuda and a GPU work, else the CPU rasterizer (%(default)s)",
    )
    p.add_argument(
        "--encoder",
        choices=ENCODERS,
        default=_env("encoder", "auto"),
        help="auto: NVENC where the GPU has it, else libx264 (%(default)s)",
    )
    p.add_argument(
        "--nvenc-preset",
        choices=NVENC_PRESETS,
        default=_env("nvenc_preset", "p1"),
        help="NVENC speed/quality preset, p1 fastest (%(default)s)",
    )
    p.add_argument(
        "--intra-refresh",
        action="store_true",
        default=_env("intra_refresh", "") in ("1", "true"),
        help="NVENC: refresh the picture in stripes instead of sending whole keyframes",
    )
    p.add_argument(
        "--scene",
        type=Path,
        default=env_value("scene"),
        help="a glTF 2.0 (.glb/.gltf) or OBJ file (default: the built-in scene)",
    )
    p.add_argument(
        "--max-triangles",
        type=int,
        default=int(_env("max_triangles", "2000000")),
        help="refuse scenes with more triangles (%(default)s)",
    )
    p.add_argument(
        "--max-scene-bytes",
        type=int,
        default=int(_env("max_scene_bytes", str(256 << 20))),
        help="refuse scene files larger than this (%(default)s)",
    )
    p.add_argument(
        "--slots",
        type=int,
        default=int(_env("slots", "2")),
        help="concurrent sessions of the embedded worker (%(default)s)",
    )
    p.add_argument(
        "--animate",
        action="store_true",
        default=_env("animate", "") in ("1", "true"),
        help="orbit the camera slowly on its own",
    )
    p.add_argument(
        "--allow-origin",
        action="append",
        default=[o for o in _env("allow_origin", "").split(",") if o],
        metavar="URL",
        help="another page origin allowed to connect (repeatable)",
    )
    p.add_argument(
        "--ice-server",
        action="append",
        default=[u for u in _env("ice_server", "").split(",") if u],
        metavar="URL",
        help="a stun:/turn: server for both peers (repeatable; none on a LAN)",
    )
    p.add_argument("--log-format", choices=("text", "json"), default=_env("log_format", "text"))
    p.add_argument("--log-level", default=_env("log_level", "INFO"))
    p.set_defaults(func=_serve)


def serve_config(args: argparse.Namespace) -> ServerConfig:
    stream = StreamConfig(
        resolution=Resolution.parse(args.resolution),
        fps=args.fps,
        bitrate=args.bitrate,
        renderer=args.renderer,
        encoder=args.encoder,
        nvenc_preset=args.nvenc_preset,
        intra_refresh=args.intra_refresh,
        animate=args.animate,
    )
    return ServerConfig(
        host=args.host,
        port=args.port,
        stream=stream,
        scene=args.scene,
        max_scene_triangles=args.max_triangles,
        max_scene_bytes=args.max_scene_bytes,
        slots=args.slots,
        allowed_origins=tuple(o.rstrip("/") for o in args.allow_origin),
        ice_servers=tuple(args.ice_server),
        log_format=args.log_format,
    )


def _serve(args: argparse.Namespace) -> int:
    from .backends import BackendUnavailable
    from .render.scene import SceneError
    from .serve import ListenError, run_server

    config = serve_config(args)
    logs.configure(args.log_level.upper(), config.log_format)
    try:
        asyncio.run(run_server(config))
    except SceneError as exc:
        print(f"render-server: cannot load the scene: {exc}", file=sys.stderr)
        return 2
    except (BackendUnavailable, ListenError) as exc:
        print(f"render-server: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


def _add_doctor(sub: argparse._SubParsersAction) -> None:
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

    from .doctor import diagnose, format_report

    logging.getLogger("render_server").setLevel(logging.ERROR)  # the report says it all
    report = diagnose(max(0.0, args.seconds))
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0


def _add_bench(sub: argparse._SubParsersAction) -> None:
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

    from .backends import Backends, choose_backends
    from .bench import bench_pipeline
    from .render.scene import default_scene

    logging.getLogger("render_server").setLevel(logging.ERROR)
    resolutions = [Resolution.parse(r) for r in args.resolutions.split(",")]
    auto = choose_backends("auto", "auto")
    pairs = {("cpu", "x264"), (auto.renderer, auto.encoder)}
    pairs |= {(auto.renderer, "x264"), ("cpu", auto.encoder)}
    scene = default_scene()
    results = []
    for renderer, encoder in sorted(pairs):
        backends = Backends(renderer, encoder, "bench", "bench", encoder, auto.gpu)
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
    _add_serve(sub)
    _add_doctor(sub)
    _add_bench(sub)
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
