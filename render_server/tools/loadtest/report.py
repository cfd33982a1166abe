"""The load test's report: per stream and aggregate figures, the verdict, the one-screen summary.

Every figure a stream is judged on is its own: a failed, frozen, slow or never-started stream is
named as such, never averaged into the others. A stream's rates (fps, Mbps) are over the time it
streamed, its first frame to its last. The hold phase, which the verdict judges, is from the
moment every stream was up (the last first frame, and not before the ramp's end) to the end of
the run; a stream that failed in it keeps its silence in the window, so its fps falls. A freeze
counts in the hold when it overlaps it: ended after the hold began, began before the run's end.
Without --min-fps a stream fails below 95 % of the rate asked for.
"""

from __future__ import annotations

import bisect
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from render_server.tools.loadtest.result import StreamResult
from render_server.tools.loadtest.runner import RunResult
from render_server.tools.loadtest.server import LATE_TIMER_S, server_check
from render_server.tools.loadtest.stream import FREEZE_INTERVALS
from render_server.tools.stats import percentile, percentiles

SCHEMA = "render-server-loadtest/1"


@dataclass
class Verdict:
    passed: bool
    reasons: list[str] = field(default_factory=list)

    @property
    def line(self) -> str:
        if self.passed:
            return "PASS"
        return "FAIL: " + "; ".join(self.reasons)


def never_started(result: StreamResult, run: RunResult) -> bool:
    """No frame before the run's end (queued the whole run, or refused)."""
    return result.first_frame_s is None or result.first_frame_s >= run.config.end_s


def all_up_s(run: RunResult) -> float:
    """When the hold begins: every stream that started has had its first frame (and the ramp
    is over)."""
    firsts = [r.first_frame_s for r in run.streams if not never_started(r, run)]
    return max([run.config.hold_start_s, *(f for f in firsts if f is not None)])


def hold_window(result: StreamResult, run: RunResult) -> tuple[float, float] | None:
    """The stream's part of the hold phase (seconds since the run's start), or None when it
    never started."""
    if result.first_frame_s is None or never_started(result, run):
        return None
    start = max(all_up_s(run), result.first_frame_s)
    end = run.config.end_s
    return (start, end) if end > start else None


def _in_window(
    events: list[tuple[float, float]], window: tuple[float, float] | None, freeze_ms: float
) -> list[float]:
    """The milliseconds of each gap (ended at s, ms) that the window holds, where that part
    alone is a freeze (over `freeze_ms`): a gap that ends just after the hold, as the harness
    tears the other streams down, or begins just before it, is not a freeze of the hold."""
    if window is None:
        return []
    held = []
    for at, ms in events:
        inside = (min(at, window[1]) - max(at - ms / 1000.0, window[0])) * 1000.0
        if inside > freeze_ms:
            held.append(round(inside, 1))
    return held


def streamed(result: StreamResult) -> tuple[float | None, float | None, float | None]:
    """(seconds from first frame to last, fps and Mbps over them); None where under 2 frames."""
    times = result.frame_t_s
    if len(times) < 2 or times[-1] <= times[0]:
        return None, None, None
    span = times[-1] - times[0]
    return span, (len(times) - 1) / span, result.bytes * 8 / span / 1e6


def stream_summary(result: StreamResult, run: RunResult) -> dict[str, Any]:
    config = run.config
    window = hold_window(result, run)
    hold_fps = None
    if window is not None:
        times = result.frame_t_s
        count = bisect.bisect_right(times, window[1]) - bisect.bisect_left(times, window[0])
        hold_fps = count / (window[1] - window[0])
    per_second = _hold_seconds(result.frames_per_s, window)
    hold_freezes = _in_window(result.freeze_events, window, FREEZE_INTERVALS * 1000 / config.fps)
    streamed_s, fps, mbps = streamed(result)
    applied = result.quality_applied or {}
    expected_size = (
        f"{applied['width']}x{applied['height']}"
        if isinstance(applied.get("width"), int) and isinstance(applied.get("height"), int)
        else f"{config.resolution.width}x{config.resolution.height}"
    )
    decode = result.decode
    decode_ok = None
    if decode is not None and not never_started(result, run):
        # every keyframe decoded is of the size asked for, or of the size the session
        # started at (the first keyframe may come before the request is applied)
        sizes = {expected_size, result.started_size or expected_size}
        decode_ok = (
            decode["decoded"] > 0 and decode["errors"] == 0 and set(decode["sizes"]) <= sizes
        )
    return {
        "index": result.index,
        "process": result.process,
        "session_id": result.session_id,
        "worker_id": result.worker_id,
        "state": "failed" if never_started(result, run) else result.state,
        "reason": result.reason or ("never started" if never_started(result, run) else None),
        "never_started": never_started(result, run),
        "requested_s": result.requested_s,
        "first_frame_s": result.first_frame_s,
        "ended_s": result.ended_s,
        "streamed_s": _round(streamed_s, 2),
        "setup_ms": _round(result.setup_ms, 1),
        "quality_requested": result.quality_requested,
        "quality_applied": result.quality_applied,
        "fps_target": config.fps,
        "fps": _round(fps, 2),
        "fps_hold": _round(hold_fps, 2),
        "fps_hold_min_1s": min(per_second) if per_second else None,
        "hold_window_s": [round(w, 3) for w in window] if window else None,
        "mbps": _round(mbps, 3),
        "frames": result.frames,
        "bytes": result.bytes,
        "keyframes": result.keyframes,
        "incomplete_frames": result.incomplete_frames,
        "packets": result.packets,
        "lost_packets": result.lost_packets,
        "duplicate_packets": result.duplicate_packets,
        "socket_packets": result.socket_packets,
        "socket_reads": result.socket_reads,
        "socket_stamped": result.socket_stamped,
        "socket_dropped": result.socket_dropped,
        "feedback_sent": result.feedback_sent,
        "nacks_sent": result.nacks_sent,
        "nacked_packets": result.nacked_packets,
        "plis_sent": result.plis_sent,
        "freezes": result.freezes,
        "freeze_ms": result.freeze_ms,
        "freezes_hold": len(hold_freezes),
        "freeze_ms_hold": round(sum(hold_freezes), 1),
        "freeze_events": [list(e) for e in result.freeze_events],
        "longest_gap_ms": result.longest_gap_ms,
        "latency_ms": percentiles(result.latency_ms),
        "timing_records": result.timing_records,
        "clock": result.clock,
        "decode": decode,
        "decode_ok": decode_ok,
        "decode_expected": expected_size,
        "worker_errors": result.worker_errors,
        "series": {
            "fps": result.frames_per_s,
            "mbps": [round(b * 8 / 1e6, 3) for b in result.bytes_per_s],
        },
    }


def _hold_seconds(per_second: list[int], window: tuple[float, float] | None) -> list[int]:
    """The per-second frame counts of the whole seconds inside the window."""
    if window is None:
        return []
    first, last = math.ceil(window[0]), math.floor(window[1])
    return [per_second[s] if s < len(per_second) else 0 for s in range(first, last)]


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def build_report(run: RunResult) -> dict[str, Any]:
    config = run.config
    streams = [stream_summary(r, run) for r in run.streams]
    all_latency = [x for r in run.streams for x in r.latency_ms]
    fps_values = [s["fps_hold"] for s in streams if s["fps_hold"] is not None]
    setups = [s["setup_ms"] for s in streams if s["setup_ms"] is not None]
    frames = sum(r.frames for r in run.streams)
    sent = sum(r.bytes for r in run.streams)
    aggregate = {
        "streams": len(streams),
        "up_to_the_end": sum(1 for s in streams if s["state"] == "closed"),
        "failed": sum(1 for s in streams if s["state"] == "failed"),
        "never_started": sum(1 for s in streams if s["never_started"]),
        "hold_start_s": round(all_up_s(run), 3),
        "fps_floor": round(config.fps_floor, 3),
        "frozen": sum(1 for s in streams if s["freezes_hold"]),
        "frozen_in_ramp": sum(1 for s in streams if s["freezes"] > s["freezes_hold"]),
        "fps_target": config.fps,
        "fps_hold_min": min(fps_values) if len(fps_values) == len(streams) else 0.0,
        "fps_hold_median": round(percentile(fps_values, 50), 2) if fps_values else None,
        "fps_hold_total": round(sum(fps_values), 2),
        "mbps_total": round(sum(s["mbps"] or 0.0 for s in streams), 3),
        "frames": frames,
        "bytes": sent,
        "keyframes": sum(r.keyframes for r in run.streams),
        "lost_packets": sum(r.lost_packets for r in run.streams),
        "packets": sum(r.packets for r in run.streams),
        "feedback_sent": sum(r.feedback_sent for r in run.streams),
        "nacks_sent": sum(r.nacks_sent for r in run.streams),
        "plis_sent": sum(r.plis_sent for r in run.streams),
        "freezes": sum(r.freezes for r in run.streams),
        "freeze_ms": round(sum(r.freeze_ms for r in run.streams), 1),
        "freezes_hold": sum(s["freezes_hold"] for s in streams),
        "freeze_ms_hold": round(sum(s["freeze_ms_hold"] for s in streams), 1),
        "latency_ms": percentiles(all_latency),
        "clock_error_max_ms": max(
            (r.clock["error_bound_ms"] for r in run.streams if r.clock), default=None
        ),
        "setup_ms": percentiles(setups),
        "setup_max_ms": max(setups) if setups else None,
        "decode_failed": sum(1 for s in streams if s["decode_ok"] is False),
        "decode": decode_totals(config.decode, [s["decode"] for s in streams if s["decode"]]),
    }
    verdict = judge(config.fps_floor, config.max_p95_ms, streams, config.transport_feedback)
    return {
        "schema": SCHEMA,
        "config": config.as_dict(),
        "mode": run.mode,
        "started_at": run.started_at,
        "wall_s": round(run.wall_s, 2),
        "harness": {
            "processes": run.processes,
            "cpu_s": round(sum(p.get("cpu_s", 0.0) for p in run.processes), 2),
            "receiver": config.receiver,
            "hold_packets_per_cpu_s": packets_per_cpu_s(run.processes),
        },
        "aggregate": aggregate,
        "server_check": server_check(
            run.server_before,
            run.server_after,
            run.server_error,
            frames,
            sent,
            aggregate["packets"],
        ),
        "verdict": {"passed": verdict.passed, "line": verdict.line, "reasons": verdict.reasons},
        "streams": streams,
    }


def decode_totals(mode: str, decodes: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Decoded, undecodable and dropped frames of all streams; the time per frame as the
    median of the streams' medians and the worst stream's p95."""
    if not decodes:
        return None
    p50s = [d["decode_ms"]["p50"] for d in decodes if d.get("decode_ms")]
    p95s = [d["decode_ms"]["p95"] for d in decodes if d.get("decode_ms")]
    return {
        "mode": mode,
        "decoders": sorted({f"{d['decoder']} ({d['kind']})" for d in decodes}),
        **{k: sum(d[k] for d in decodes) for k in ("decoded", "undecodable", "dropped")},
        "ms_p50": round(percentile(p50s, 50), 3) if p50s else None,
        "ms_p95_worst": max(p95s) if p95s else None,
    }


def packets_per_cpu_s(processes: list[dict[str, Any]]) -> float | None:
    """RTP packets received per CPU-second of the harness over the hold, all processes."""
    windows = [p["hold_window"] for p in processes if p.get("hold_window")]
    cpu = sum(w["cpu_s"] for w in windows)
    return round(sum(w["packets"] for w in windows) / cpu) if cpu > 0 else None


def judge(
    min_fps: float | None,
    max_p95_ms: float | None,
    streams: list[dict[str, Any]],
    transport_feedback: bool = False,
) -> Verdict:
    reasons = []
    failed = [s for s in streams if s["state"] == "failed" and not s["never_started"]]
    if failed:
        reasons.append(f"{len(failed)} stream(s) failed ({_names(failed)})")
    idle = [s for s in streams if s["never_started"]]
    if idle:
        reasons.append(f"{len(idle)} stream(s) never started ({_names(idle)})")
    frozen = [s for s in streams if s["freezes_hold"]]
    if frozen:
        reasons.append(f"{len(frozen)} stream(s) froze in the hold ({_names(frozen)})")
    behind = [s for s in streams if s["socket_dropped"]]
    if behind:  # lost on the harness's side: the run cannot say whether the server held
        reasons.append(
            f"{len(behind)} stream(s) lost datagrams in the harness's own full socket buffers, "
            f"the harness fell behind ({_names(behind)})"
        )
    mute = [s for s in streams if s["frames"] and not s["feedback_sent"]]
    if transport_feedback and mute:  # the worker ran without it: the run measured REMB's path
        reasons.append(f"{len(mute)} stream(s) sent no transport-cc feedback ({_names(mute)})")
    bad_video = [s for s in streams if s["decode_ok"] is False]
    if bad_video:
        reasons.append(f"{len(bad_video)} stream(s) failed the decode check ({_names(bad_video)})")
    if min_fps is not None:
        slow = [
            s
            for s in streams
            if not s["never_started"] and (s["fps_hold"] is None or s["fps_hold"] < min_fps)
        ]
        if slow:
            reasons.append(
                f"{len(slow)} stream(s) below {min_fps:g} fps over the hold ({_names(slow)})"
            )
    if max_p95_ms is not None:
        # at worst the clock offset was off by its bound the other way: pass only what held even so
        late = [
            s
            for s in streams
            if s["latency_ms"] is None
            or s["latency_ms"]["p95"] + (s["clock"] or {}).get("error_bound_ms", 0.0) > max_p95_ms
        ]
        if late:
            reasons.append(
                f"{len(late)} stream(s) with p95 latency plus their clock's error bound above "
                f"{max_p95_ms:g} ms, or unmeasured ({_names(late)})"
            )
    return Verdict(not reasons, reasons)


def _names(streams: list[dict[str, Any]], most: int = 6) -> str:
    names = ", ".join(f"#{s['index']}" for s in streams[:most])
    return names + (", …" if len(streams) > most else "")


def _fmt(value: Any, spec: str = ".1f", none: str = "-") -> str:
    return none if value is None else format(value, spec)


def summary_text(report: dict[str, Any], report_dir: str | None = None, rows: int = 8) -> str:
    """One screen: what ran, the aggregate, the worst streams, the server's count, the verdict."""
    c, a, m = report["config"], report["aggregate"], report["mode"]
    processes = len(report["harness"]["processes"])
    lat, setup = a["latency_ms"] or {}, a["setup_ms"] or {}
    lines = [
        f"render-server loadtest: {c['streams']} × {c['resolution']} @ {c['fps']:g} fps, "
        f"ramp {c['ramp_s']:g} s + hold {c['duration_s']:g} s, {processes} "
        f"process(es), against {c['server']}",
        f"worker mode: {m['description']}",
        f"streams: {a['up_to_the_end']} up to the end, {a['failed']} failed "
        f"({a['never_started']} never started), {a['frozen']} froze"
        f" in the hold ({a['freezes_hold']} freezes, {a['freeze_ms_hold'] / 1000:.1f} s); "
        f"{a['frozen_in_ramp']} froze during the ramp ({a['freezes'] - a['freezes_hold']} "
        "freezes: a gap > 3 frame intervals while sessions were starting)",
        f"fps over the hold (from {a['hold_start_s']:.1f} s, all streams up): min "
        f"{_fmt(a['fps_hold_min'])}, median {_fmt(a['fps_hold_median'])} (target {c['fps']:g}, "
        f"floor {a['fps_floor']:g}); {a['mbps_total']:.1f} Mbps in all (each over its streaming)",
        f"frame latency (worker frame start → last packet in): p50 {_fmt(lat.get('p50'))} "
        f"p95 {_fmt(lat.get('p95'))} p99 {_fmt(lat.get('p99'))} ms over {lat.get('count', 0)} "
        f"frames, each stream's clocks aligned within ± {_fmt(a['clock_error_max_ms'], '.2f')} ms",
        f"setup (request → first frame): p50 {_fmt(setup.get('p50'), '.0f')} "
        f"max {_fmt(a['setup_max_ms'], '.0f')} ms; lost "
        f"packets {a['lost_packets']} of {a['packets']}, NACKs {a['nacks_sent']}, PLIs "
        f"{a['plis_sent']}, transport-cc feedback {a['feedback_sent']}, decode check failed on "
        f"{a['decode_failed']}",
    ]
    d = a["decode"]
    if d is not None:
        lines.append(
            f"decode ({d['mode']}, {', '.join(d['decoders'])}): {d['decoded']} frames decoded, "
            f"{d['undecodable']} undecodable, {d['dropped']} dropped; per frame p50 "
            f"{_fmt(d['ms_p50'], '.2f')} ms (median stream), p95 {_fmt(d['ms_p95_worst'], '.2f')}"
            " ms (worst stream)"
        )
    h = report["harness"]
    lines.append(
        f"harness: {h['receiver']} receiver, {h['cpu_s']:.1f} CPU-s in all; over the hold "
        f"{_fmt(h['hold_packets_per_cpu_s'], '.0f')} RTP packets per CPU-second"
    )
    if h["receiver"] == "count":
        decoding = report["config"].get("decode_mode", "none") != "none"
        lines.append(
            "count receiver: frames and packets read from the SRTP headers in the clear; "
            + (
                "only the sampled keyframes decrypted and decoded"
                if decoding
                else "nothing decrypted, reassembled or decoded: what the server sent, not what "
                "a viewer could show"
            )
        )
    check = report["server_check"]
    if "error" in check:
        lines.append(f"server /metrics: unreadable after the run ({check['error']})")
    else:
        lines.append(
            f"server /metrics: {check['server_frames']} frames, {check['server_bytes'] / 1e6:.1f}"
            f" MB sent; harness received {check['harness_frames']} frames "
            f"({_fmt(check['frames_ratio'], '.2%')}), {check['harness_bytes'] / 1e6:.1f} MB "
            f"({_fmt(check['bytes_ratio'], '.2%')}); its full garbage collections "
            f"{check['server_full_collections']}, {check['server_full_collection_ms']:.0f} ms; "
            f"its event loops ran {check['server_late_timers']} timers more than "
            f"{LATE_TIMER_S * 1000:g} ms late; it paused sessions "
            f"{check['server_session_pauses']} times (no RTCP from their client for 3 s)"
        )
    lines.append(
        f"{'#':>4} {'state':<7} {'fps':>6} {'min1s':>5} {'Mbps':>7} {'p50':>6} {'p95':>6} "
        f"{'p99':>6} {'frz':>5} {'lost':>5} {'setup':>6}  reason"
    )
    worst = sorted(
        report["streams"],
        key=lambda s: (s["state"] != "failed", -s["freezes_hold"], s["fps_hold"] or 0.0),
    )
    for s in worst[:rows]:
        sl = s["latency_ms"] or {}
        lines.append(
            f"{s['index']:>4} {s['state']:<7} {_fmt(s['fps_hold']):>6} "
            f"{_fmt(s['fps_hold_min_1s'], 'd'):>5} {_fmt(s['mbps'], '.2f'):>7} "
            f"{_fmt(sl.get('p50')):>6} {_fmt(sl.get('p95')):>6} {_fmt(sl.get('p99')):>6} "
            f"{s['freezes_hold']:>5} {s['lost_packets']:>5} {_fmt(s['setup_ms'], '.0f'):>6}  "
            f"{s['reason'] or ''}"
        )
    if len(worst) > rows:
        lines.append(f"     … {len(worst) - rows} more (worst first) in report.json")
    if report_dir:
        lines.append(f"report: {report_dir}/report.json, {report_dir}/report.html")
    lines.append(report["verdict"]["line"])
    return "\n".join(lines)


def write_report(run: RunResult, directory: Path) -> tuple[dict[str, Any], str]:
    """Write `report.json` and `report.html` into `directory`; the report and its summary."""
    from render_server.tools.loadtest.html import plots, render_html

    report = build_report(run)
    summary = summary_text(report, str(directory))
    (directory / "report.json").write_text(json.dumps(report, indent=2))
    (directory / "report.html").write_text(render_html(report, summary, plots(run)))
    return report, summary
