"""`render-server worker`: a worker process that registers with a signaling server."""

from __future__ import annotations

import argparse
from pathlib import Path

from render_server import logs
from render_server.cli.option_values import env, env_list
from render_server.cli.options import (
    WORKER,
    SubParsers,
    auth_options,
    lifecycle_options,
    log_options,
    stream_options,
    worker_config,
)
from render_server.config import env_value


def add_worker(sub: SubParsers) -> None:
    p = sub.add_parser(
        "worker",
        help="run a worker that registers with a signaling server and serves its sessions",
        description="A worker process: registers with the signaling server over a WebSocket "
        "(its capabilities: GPU, renderer, encoders, slots, labels), sends heartbeats and "
        "streams the sessions placed on it. Reconnects with backoff.",
    )
    p.add_argument(
        "--signaling", action="append", default=None, metavar="URL[,URL...]",
        help="a signaling replica's worker socket, tried in turn with the others when one is "
        f"lost (repeatable, or comma-separated; default {WORKER.signaling_url}); "
        "RENDER_SERVER_SIGNALING takes a comma-separated list too",
    )  # fmt: skip
    p.add_argument(
        "--token", default=env_value("token"),
        help="a worker token (else one is minted from --secret/--key-file); a flag shows in "
        "`ps`: prefer --token-file or RENDER_SERVER_TOKEN",
    )  # fmt: skip
    p.add_argument("--token-file", type=Path, default=env_value("token_file"),
                   help="a file holding the worker token")  # fmt: skip
    p.add_argument("--worker-id", default=env("worker_id", WORKER.worker_id),
                   help="default: host and pid")  # fmt: skip
    p.add_argument(
        "--ice-server", action="append", default=env_list("ice_server"), metavar="URL",
        help="a stun: server (repeatable)",
    )  # fmt: skip
    lifecycle_options(p)
    auth_options(p, with_mode=False)
    stream_options(p)
    log_options(p)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from render_server.cli.process import run_process, run_worker

    config = worker_config(args)
    logs.configure(args.log_level.upper(), config.log_format)
    return run_process(run_worker(config))
