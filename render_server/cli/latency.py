"""`render-server latency`: a running server's latency per stage, from Python or Chromium."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from render_server.cli.options import SubParsers
from render_server.encode.codecs import CODECS


def add_latency(sub: SubParsers) -> None:
    p = sub.add_parser(
        "latency",
        help="measure a running server's latency: each stage, glass-to-glass, input-to-frame",
        description="Open a session on a running server, drag the camera for a while, and "
        "print p50/p95/p99 of each stage of each frame (from the worker's timing records "
        "matched with the frames as they arrived) and of the totals. --client python times "
        "the last RTP packet of each frame in (no decoding: glass-to-glass ends there); "
        "--client chromium drives headless Chromium on the server's page, whose SDK adds "
        "the jitter buffer, decode and display, then makes short drags after stillness and "
        "prints the first move's input-to-photon read from the pixels (the SDK's meter).",
    )
    p.add_argument("--url", default="http://127.0.0.1:8080", help="the server (%(default)s)")
    p.add_argument("--seconds", type=float, default=10.0, help="of dragging (%(default)s)")
    p.add_argument("--token", help="a controller token, where the server asks for one")
    p.add_argument("--client", choices=("python", "chromium"), default="python")
    p.add_argument(
        "--decode", choices=("none", "keyframes", "all"), default="keyframes",
        help="python client: which frames to decode to check the picture (%(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--first-moves", type=int, default=20, metavar="N",
        help="chromium client: short drags after stillness for the pixel meter (%(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--codec", type=str.upper, choices=CODECS,
        help="ask for this codec (default: H264 for the python client, the SDK's choice for "
        "chromium)",
    )  # fmt: skip
    p.add_argument(
        "--relay", action="store_true",
        help="python client: connect through the session's TURN servers only (ICE policy relay)",
    )  # fmt: skip
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.set_defaults(func=run_latency)


def run_latency(args: argparse.Namespace) -> int:
    from render_server.tools.measure.client import MeasureError, measure_latency

    try:
        if args.client == "chromium":
            from render_server.tools.measure.browser import measure_in_chromium

            report = measure_in_chromium(
                args.url, args.seconds, args.token, first_moves=max(0, args.first_moves),
                codec=args.codec,
            )  # fmt: skip
        else:
            report = asyncio.run(
                measure_latency(
                    args.url,
                    args.seconds,
                    args.token,
                    args.decode,
                    codec=args.codec or "H264",
                    relay_only=args.relay,
                )
            )
    except (MeasureError, OSError, TimeoutError) as exc:
        print(f"render-server latency: {str(exc) or type(exc).__name__}", file=sys.stderr)
        return 1
    except Exception as exc:  # Playwright's errors, aiohttp's: one line, not a trace
        print(f"render-server latency: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(report, indent=2) if args.json else format_report(report, args.client))
    return 0


def rows(report: dict[str, Any]) -> list[tuple[str, dict[str, Any] | None]]:
    """(name, {p50, p95, p99, ...}) of each stage, then of the totals, for either client's
    report (the Python client's snake_case or the SDK's camelCase)."""
    out = list(report["stages"].items())
    out.append(("glass-to-glass", report.get("glass_to_glass", report.get("glassToGlass"))))
    out.append(("input-to-frame", report.get("input_to_frame", report.get("inputToPhoton"))))
    return out


def format_report(report: dict[str, Any], client: str) -> str:
    lines = [f"{'stage':<16}{'p50':>9}{'p95':>9}{'p99':>9}   ms"]
    if report.get("codec"):
        lines.insert(0, f"codec {report['codec']}")
    for name, s in rows(report):
        if not s or s.get("p50") is None:
            lines.append(f"{name:<16}{'-':>9}{'-':>9}{'-':>9}")
        else:
            lines.append(f"{name:<16}{s['p50']:>9.2f}{s['p95']:>9.2f}{s['p99']:>9.2f}")
    if client == "python":
        clock = report["clock"]
        lines.append(
            f"{report['frames']} frames matched of {report['observed']} received, "
            f"{report['inputs_answered']}/{report['inputs']} inputs seen in a frame, "
            f"{report['lost_packets']} packets lost; clock offset {clock['offset_ms']:.2f} "
            f"± {clock['error_bound_ms']:.2f} ms (fastest rtt {clock['rtt_ms']:.2f} ms). "
            "Glass-to-glass ends at the frame's last packet in."
        )
        if "decode" in report:
            d = report["decode"]
            sizes = ", ".join(f"{k} ×{n}" for k, n in d["sizes"].items()) or "none"
            lines.append(f"decoded ({d['mode']}): {sizes}; {d['errors']} errors")
    else:
        first = report.get("firstMove") or {}
        if first.get("count"):
            lines.append(
                f"{'first move':<16}{first['p50']:>9.2f}{first['p95']:>9.2f}{first['max']:>9.2f}"
                f"   ms (max, not p99), {first['count']} moves after stillness, input event → "
                f"first changed frame on the glass, by the pixels; {first['unchanged']} changed "
                f"nothing, {first.get('moving', 0)} came while the picture changed by itself"
            )
        lines.append(
            f"{report['frames']} displayed frames with a timing record "
            f"(clock rtt {report.get('clockRttMs', float('nan')):.2f} ms). "
            "Glass-to-glass ends when Chromium displays the frame; input-to-frame starts at "
            "the browser's input event."
        )
    return "\n".join(lines)
