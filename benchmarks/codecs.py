"""Latency of each codec against H.264, in real Chromium on loopback, in the same run.

For each size, one `render-server serve` (CPU renderer; libx264, libvpx and SVT-AV1 as the
worker picks them, `--playout-delay low`, the size's default bitrate) streams to headless
Chromium once per codec, one after the other, each asked for through the designer page's
`?codec=` (the SDK's `codecs` option: the offer then holds that codec only). Everything else is
the same on every side: the server, the page, the drag, the window over which frames count
(benchmarks/latency.py's measuring scripts), the first moves after stillness. The baseline is
H.264, the codec of every figure before VP8 and AV1 came; the issue's target is each codec's
input-to-photon within 20 % of H.264's.

Input-to-photon in one window falls in one of two modes about 15 ms apart, set by the drag's
phase against the worker's tick and the jitter buffer's render times (two H.264 windows on one
server read 13.6 and 28 ms), so its ratio moves between runs by more than any codec does. The
table's `own` column is steadier: each frame's encode, send, network and decode stages (what a
codec changes), summed per frame, p50 over the window, and `own-H264` its difference in ms.

    python benchmarks/codecs.py [--seconds 8] [--first-moves 20]
        [--sizes 1280x720@30] [--codecs H264,VP8,AV1] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from latency import (
    CLOSE_WINDOW_JS,
    OPEN_WINDOW_JS,
    SUMMARY_JS,
    _count,
    _ms,
    figures,
    our_server,
)

from render_server.encode.codecs import parse_codecs
from render_server.tools.measure.browser import CODEC_STAGES_JS, measure_in_chromium

BASELINE = "H264"


# benchmarks/latency.py's summary, plus the codec's own stages per frame of the window
CODEC_SUMMARY_JS = f"""() => {{
  const summary = ({SUMMARY_JS})();
  const sums = ({CODEC_STAGES_JS})(window.renderStream.latencyMeter.frames).sort((a, b) => a - b);
  summary.ownStagesP50 = sums.length ? sums[Math.floor((sums.length - 1) / 2)] : null;
  return summary;
}}"""


def measure_codec(
    url: str, codec: str, seconds: float, viewport: tuple[int, int], first_moves: int
) -> dict[str, Any]:
    report = measure_in_chromium(
        url, seconds, viewport=viewport, before_drag=OPEN_WINDOW_JS, after_drag=CLOSE_WINDOW_JS,
        summary_script=CODEC_SUMMARY_JS, first_moves=first_moves, codec=codec,
    )  # fmt: skip
    if report.get("codec") != codec:  # never count one codec's figures as another's
        raise RuntimeError(f"asked for {codec}, the page got {report.get('codec')!r}")
    return {"codec": codec, "own_p50": report.get("ownStagesP50"), **figures(report)}


def _ratio(value: float | None, base: float | None) -> str:
    return "-" if value is None or not base else f"{value / base:.2f}"


def _difference(value: float | None, base: float | None) -> str:
    return "-" if value is None or base is None else f"{value - base:+.1f}"


def table(size: str, rows: list[dict[str, Any]]) -> str:
    base = next((r for r in rows if r["codec"] == BASELINE), rows[0])
    head = (
        f"{'codec':<6}{'shown':>7}{'fps':>6}{'i2p p50':>9}{'g2g p50':>9}{'g2g p95':>9}"
        f"{'encode':>8}{'decode':>8}{'own':>7}{'1st p50':>9}{'1st p95':>9}{'i2p/H264':>10}"
        f"{'1st/H264':>10}{'own-H264':>10}"
    )
    lines = [
        f"{size} (ms; shown = frames displayed in the drag window; 1st = first move; own = "
        "encode + send + network + decode a frame)",
        head,
    ]
    for r in rows:
        lines.append(
            f"{r['codec']:<6}{_count(r['shown']):>7}{_count(r['fps'], 1):>6}"
            f"{_ms(r['i2p_p50']):>9}{_ms(r['g2g_p50']):>9}{_ms(r['g2g_p95']):>9}"
            f"{_ms(r.get('encode_p50')):>8}{_ms(r.get('decode_p50')):>8}{_ms(r['own_p50']):>7}"
            f"{_ms(r['first_move_p50']):>9}{_ms(r['first_move_p95']):>9}"
            f"{_ratio(r['i2p_p50'], base['i2p_p50']):>10}"
            f"{_ratio(r['first_move_p50'], base['first_move_p50']):>10}"
            f"{_difference(r['own_p50'], base['own_p50']):>10}"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )  # fmt: skip
    parser.add_argument("--seconds", type=float, default=8.0, help="drag (window) per codec")
    parser.add_argument("--sizes", default="1280x720@30", help="WxH@fps,...")
    parser.add_argument("--codecs", default="H264,VP8,AV1", help="in the order they run")
    parser.add_argument("--first-moves", type=int, default=20, help="per codec")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    codecs = parse_codecs(args.codecs)
    results: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="codecs-bench-") as tmp:
        for spec in args.sizes.split(","):
            size, fps_text = spec.split("@")
            width, height = (int(v) for v in size.split("x"))
            fps = float(fps_text)
            rows = []
            with our_server(width, height, fps, Path(tmp)) as url:
                for codec in codecs:
                    print(f"{spec} {codec} ...", file=sys.stderr, flush=True)
                    rows.append(
                        measure_codec(url, codec, args.seconds, (width, height), args.first_moves)
                    )
            results[spec] = rows
            if not args.json:
                print(table(spec, rows), flush=True)
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
