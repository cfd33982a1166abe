"""`render-server doctor`: what this machine offers (CUDA, NVENC, libx264) and what auto picks."""

from __future__ import annotations

import argparse
import json
import logging

from render_server.cli.options import SubParsers


def add_doctor(sub: SubParsers) -> None:
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
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from render_server.backends.doctor import diagnose, format_report

    logging.getLogger("render_server").setLevel(logging.ERROR)  # the report says it all
    report = diagnose(max(0.0, args.seconds))
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0
