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
    p.add_argument("--renderer", choices=RENDERERS, default=_env("renderer", "cpu"))
    p.add_argument("--encoder", choices=ENCODERS, default=_env("encoder", "x264"))
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
    from .render.scene import SceneError
    from .serve import run_server

    config = serve_config(args)
    logs.configure(args.log_level.upper(), config.log_format)
    try:
        asyncio.run(run_server(config))
    except SceneError as exc:
        print(f"render-server: cannot load the scene: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the port is taken, the address is not ours
        print(
            f"render-server: cannot listen on {config.host}:{config.port}: {exc}", file=sys.stderr
        )
        return 2
    except KeyboardInterrupt:
        pass
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
