"""`render-server serve` (signaling, the web client and an embedded worker in one process) and
`render-server signaling` (a replica with no worker of its own)."""

from __future__ import annotations

import argparse

from render_server import logs
from render_server.cli.options import (
    SubParsers,
    auth_options,
    log_options,
    server_config,
    signaling_options,
    stream_options,
)
from render_server.cli.scene_options import scene_options


def add_serve(sub: SubParsers) -> None:
    p = sub.add_parser(
        "serve",
        help="run the signaling server, the web client and one embedded worker in one process",
        description="Run the signaling server, serve the web client and stream from one "
        "embedded worker. Open the printed URL in Chromium (the stream is H.264 only). On a "
        "loopback address no token is needed; anywhere else, set --secret-file (or "
        "RENDER_SERVER_SECRET).",
    )
    signaling_options(p, "127.0.0.1")
    auth_options(p)
    scene_options(p, with_max_bytes=False)  # --max-scene-bytes is among the worker's
    stream_options(p)
    log_options(p)
    p.set_defaults(func=_run, embedded=True)


def add_signaling(sub: SubParsers) -> None:
    p = sub.add_parser(
        "signaling",
        help="run a signaling replica: browsers and workers meet here (no worker of its own)",
        description="A signaling replica: pairs browsers with the slots of registered workers, "
        "queues them fairly when every slot is busy, relays their negotiation. Several "
        "replicas behind a load balancer share one --registry redis://... Tokens are required "
        "(--secret or RENDER_SERVER_SECRET) unless --auth off.",
    )
    signaling_options(p, "0.0.0.0")
    auth_options(p)
    scene_options(p, with_max_bytes=True)
    log_options(p)
    p.set_defaults(func=_run, embedded=False)


def _run(args: argparse.Namespace) -> int:
    from render_server.cli.process import run_process, run_server

    config = server_config(args, embedded_worker=args.embedded)
    logs.configure(args.log_level.upper(), config.log_format)
    return run_process(run_server(config))
