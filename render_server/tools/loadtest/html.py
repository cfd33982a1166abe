"""`report.html`: the summary, the per-stream table and matplotlib plots embedded as PNGs."""

from __future__ import annotations

import base64
import html
import io
from typing import Any

from render_server.tools.loadtest.runner import RunResult


def _png(figure: Any) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def plots(run: RunResult) -> dict[str, str]:
    """Base64 PNGs: fps per second per stream, latency over time, the CDF of latency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    config = run.config
    out = {}
    many = len(run.streams) > 12

    figure, ax = plt.subplots(figsize=(10, 4))
    for r in run.streams:
        style = {"color": "red", "linewidth": 2} if r.state == "failed" else {"linewidth": 1}
        ax.plot(range(len(r.frames_per_s)), r.frames_per_s, label=None if many else f"#{r.index}",
                alpha=0.8, **style)  # fmt: skip
    ax.axhline(config.fps, color="grey", linestyle="--", label=f"target {config.fps:g}")
    if config.min_fps is not None:
        ax.axhline(config.min_fps, color="orange", linestyle=":", label=f"min {config.min_fps:g}")
    ax.axvspan(0, config.ramp_s, color="0.92", label="ramp")
    ax.set_xlabel("seconds since the start")
    ax.set_ylabel("frames in that second")
    ax.set_title("fps per stream (failed streams in red)")
    ax.legend(fontsize="small", ncol=4)
    out["fps"] = _png(figure)
    plt.close(figure)

    figure, ax = plt.subplots(figsize=(10, 4))
    for r in run.streams:
        if r.latency_ms:
            ax.plot(r.latency_t_s, r.latency_ms, ".", markersize=2, alpha=0.5,
                    label=None if many else f"#{r.index}")  # fmt: skip
    if config.max_p95_ms is not None:
        ax.axhline(config.max_p95_ms, color="orange", linestyle=":", label="max p95")
    ax.set_xlabel("seconds since the start")
    ax.set_ylabel("ms")
    ax.set_title("frame latency: worker frame start → last packet in")
    if not many:
        ax.legend(fontsize="small", ncol=4, markerscale=4)
    out["latency"] = _png(figure)
    plt.close(figure)

    figure, ax = plt.subplots(figsize=(10, 4))
    everything = sorted(x for r in run.streams for x in r.latency_ms)
    if everything:
        n = len(everything)
        ax.plot(everything, [(i + 1) / n for i in range(n)], label="all streams", linewidth=2)
    if not many:
        for r in run.streams:
            values = sorted(r.latency_ms)
            if values:
                ax.plot(values, [(i + 1) / len(values) for i in range(len(values))],
                        linewidth=0.8, alpha=0.7, label=f"#{r.index}")  # fmt: skip
    ax.set_xlabel("frame latency, ms")
    ax.set_ylabel("fraction of frames")
    ax.set_title("CDF of frame latency")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", ncol=4)
    out["cdf"] = _png(figure)
    plt.close(figure)
    return out


def _decode_cells(decode: dict[str, Any] | None) -> list[Any]:
    if not decode:
        return [None] * 4
    timing = decode.get("decode_ms") or {}
    return [timing.get("p50"), timing.get("p95"), decode["dropped"], decode["undecodable"]]


def render_html(report: dict[str, Any], summary: str, images: dict[str, str]) -> str:
    rows = []
    for s in report["streams"]:
        lat = s["latency_ms"] or {}
        css = ' class="bad"' if s["state"] == "failed" or s["freezes_hold"] else ""
        cells = [
            s["index"], s["state"], s["fps_hold"], s["fps_hold_min_1s"], s["mbps"],
            lat.get("p50"), lat.get("p95"), lat.get("p99"), s["freezes_hold"], s["freezes"],
            s["lost_packets"], s["nacks_sent"], s["plis_sent"], s["setup_ms"], s["streamed_s"],
            "ok" if s["decode_ok"] else "-" if s["decode_ok"] is None else "FAILED",
            *_decode_cells(s["decode"]),
            s["reason"] or "",
        ]  # fmt: skip
        rows.append(
            f"<tr{css}>" + "".join(f"<td>{html.escape(_cell(c))}</td>" for c in cells) + "</tr>"
        )
    heads = (
        "#", "state", "fps (hold)", "min fps/1s", "Mbps", "p50 ms", "p95 ms", "p99 ms",
        "freezes (hold)", "freezes (all)", "lost pkts", "NACKs", "PLIs", "setup ms", "streamed s",
        "decode", "decode ms p50", "decode ms p95", "dropped", "undecodable", "reason",
    )  # fmt: skip
    images_html = "".join(
        f'<h2>{title}</h2><img alt="{title}" src="data:image/png;base64,{images[key]}">'
        for key, title in (
            ("fps", "fps over time"),
            ("latency", "latency over time"),
            ("cdf", "CDF of latency"),
        )
        if key in images
    )
    verdict = report["verdict"]
    colour = "green" if verdict["passed"] else "red"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>render-server loadtest</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; }}
pre {{ background: #f4f4f4; padding: 1em; }}
table {{ border-collapse: collapse; font-size: 0.85em; }}
td, th {{ border: 1px solid #ccc; padding: 2px 6px; text-align: right; }}
tr.bad td {{ background: #fdd; }}
.verdict {{ font-size: 1.4em; font-weight: bold; color: {colour}; }}
</style></head><body>
<h1>render-server loadtest</h1>
<p class="verdict">{html.escape(verdict["line"])}</p>
<pre>{html.escape(summary)}</pre>
<h2>streams</h2>
<table><tr>{"".join(f"<th>{h}</th>" for h in heads)}</tr>
{"".join(rows)}
</table>
{images_html}
</body></html>
"""


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)
