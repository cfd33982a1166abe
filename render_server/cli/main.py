"""The `render-server` command line: one module per command, the option groups in `options`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from render_server import __version__
from render_server.cli.bench import add_bench
from render_server.cli.doctor import add_doctor
from render_server.cli.drain import add_drain
from render_server.cli.latency import add_latency
from render_server.cli.loadtest import add_loadtest
from render_server.cli.serve import add_serve, add_signaling
from render_server.cli.token import add_token
from render_server.cli.worker import add_worker

DESCRIPTION = """\
Stream a rendered 3D scene to the browser over WebRTC.

  serve      one process: signaling, the web client and an embedded worker
  signaling  a signaling replica (no worker); several share a Redis registry
  worker     a worker process that registers with a signaling server
  drain      drain the worker on this host and wait (a Kubernetes preStop hook)
  token      mint an access token (JWT) for a worker, controller, viewer or admin
  doctor     what this machine offers (CUDA, NVENC, libx264) and what auto picks
  bench      per-frame cost of each renderer/encoder pair
  latency    measure a running server's latency, stage by stage
  loadtest   many real WebRTC viewers against a server: what held, per stream

Every option can also be set with an environment variable RENDER_SERVER_<OPTION>
(e.g. RENDER_SERVER_PORT=9000, RENDER_SERVER_SECRET=...); a flag wins over the environment."""

COMMANDS = (
    add_serve, add_signaling, add_worker, add_drain, add_token, add_doctor, add_bench,
    add_latency, add_loadtest,
)  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="render-server",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        return int(args.func(args))
    except ValueError as exc:  # a ConfigError: a value the configuration cannot use
        parser.error(str(exc))
    return 2


if __name__ == "__main__":
    sys.exit(main())
