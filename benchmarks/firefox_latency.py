"""Firefox's latency on the real stream against Chromium's, on the same codec (VP8), in one run.

One `render-server serve` (CPU renderer, benchmarks/latency.py's `our_server`: `--playout-delay
low`, the size's default bitrate) streams to two browsers, one after the other, on the designer
page at the same viewport:

- Chromium (headless, Playwright: `measure_in_chromium`), asked for VP8 with `?codec=VP8`;
- Firefox (Debian's firefox-esr, headless, Marionette: tests/firefox.py, stock preferences: its
  PREFS only), on the plain page: its offer has no H.264, so the SDK asks for VP8 by itself; the
  script checks that the session's codec is VP8 and stops if it is not.

Everything else is the same on both sides: benchmarks/latency.py's window scripts (the SDK's
LatencyMeter keeps every frame displayed during the drag; the percentiles are over those), a
left-button drag back and forth across the middle of the video for `--seconds`, then
`--first-moves` short drags each after 1.5 s without input for the SDK's pixel meter
(client/first-move.js: input event → first displayed frame whose pixels changed). Chromium's
drag is Playwright's (`drag`, `first_move_drags`); Firefox's is a real WebDriver pointer drag
(`Firefox.drag_over_time`): each sweep one `pointerMove` with a duration, which Marionette
plays as a pointermove every 17 ms, a continuous ~60 Hz motion. Around the window the script
also counts, in the page, the frames `requestVideoFrameCallback` reports (`shown`, in both
browsers: the meter counts only frames with `rtpTimestamp` and `receiveTime`), the steering
pointer events the SDK listens to (`in/s`), keeps the callbacks' metadata and the receiver's
getStats() at both ends; in Firefox it reads the worker's camera before and after the drag (it
must have turned).

The baseline is Chromium, measured on the same server in the same run: the ratios are
Firefox / Chromium for input-to-photon p50 and first-move p50.

Firefox comes first: where it cannot start (one line, exit status 2), gets another codec or
does not steer, the run stops before Chromium's turn. Its drag must turn the worker's camera
and give the SDK's meter input-to-photon samples.

What sets Firefox's figures apart (firefox-esr 153; the probe checks each on every run and
prints it under the table, with a note where it changes how a figure reads):

- requestVideoFrameCallback: Firefox gives `receiveTime`, `rtpTimestamp` and
  `processingDuration` for a WebRTC frame as Chromium does (no `captureTime` in either: the
  worker sends no abs-capture-time), so the SDK's LatencyMeter matches its frames with their
  records and every stage is there. But its `expectedDisplayTime` equals `presentationTime`
  equals the callback's `now` on every frame (Gecko reports a frame already composited at the
  refresh tick that runs the callback): Firefox's display stage is 0, and its glass-to-glass
  and input-to-photon end at that tick, where Chromium's end at its estimate of the next
  refresh. Chromium's `presentationTime` comes ~10 ms after `receiveTime`, Firefox's ~3 ms:
  the meter's jitterBuffer stage (presentationTime − receiveTime − decode) is each browser's
  way to its compositor rather than its jitter buffer; getStats' jitterBufferDelay /
  jitterBufferEmittedCount (both browsers have them, and totalDecodeTime, framesDecoded) is
  printed beside it.
- `mediaTime` is 0 on every WebRTC frame in Firefox (and `new VideoFrame(video).timestamp` is
  the whole seconds of currentTime, written as microseconds). The pixel meter used to check
  the frame it read against the callback's mediaTime and so refused every sample once the
  stream had played a second (all first moves `moving`); it now ignores a mediaTime that stays
  put while frames are presented and reads the frame the element holds at the callback's tick
  (tests/test_firefox_stream.py holds it).
- Firefox's `new VideoFrame(video)` is BGRA (an RGB readback of the whole picture: ~12 ms a
  sample at 1280x720 on the page's main thread, against ~1 ms for Chromium's I420); the meter
  draws such frames into its small canvas instead (~8 ms here).
- `pointerrawupdate` exists in Firefox 153 and fires for Marionette's moves: the SDK's
  InputCapture listens to it in both browsers (`in/s` counts it).

    python benchmarks/firefox_latency.py [--seconds 8] [--first-moves 20] [--size 1280x720@30]
        [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pytest  # noqa: E402  (tests/firefox.py reports a Firefox that cannot start with pytest.fail)
from latency import (  # noqa: E402
    CLOSE_WINDOW_JS,
    OPEN_WINDOW_JS,
    SUMMARY_JS,
    _count,
    _ms,
    figures,
    our_server,
)

from render_server.tools.measure.browser import (  # noqa: E402
    FIRST_MOVE_HOLD_MS,
    FIRST_MOVE_STILL_MS,
    STREAMING_TIMEOUT_MS,
    measure_in_chromium,
)
from tests.firefox import Firefox, firefox_path, launch_firefox  # noqa: E402

CODEC = "VP8"  # the one codec stock Firefox gets (tests/test_firefox_stream.py)
SWEEP_MS = 200  # one sweep of the drag, a sixth of the width: ~12 moves at Marionette's 17 ms
FIRST_MOVE_LEG_MS = 100  # the first moves' sweeps (a twelfth of the width): ~6 moves each
SLOTS_FREE_TIMEOUT_S = 20.0
STAGES = ("render", "encode", "send", "network", "jitterBuffer", "decode")
RVFC_FIELDS = ("receiveTime", "rtpTimestamp", "captureTime", "processingDuration", "mediaTime")
STATS_FIELDS = ("framesDecoded", "jitterBufferDelay", "jitterBufferEmittedCount",
                "totalDecodeTime", "totalProcessingDelay")  # fmt: skip

# -- page-side scripts: benchmarks/latency.py's window, with this script's probe around it ------

# the video receiver's inbound-rtp stats, as plain JSON
_INBOUND_JS = """async (pc) => {
  let found = null;
  (await pc.getStats()).forEach((s) => {
    if (s.type === 'inbound-rtp' && s.kind === 'video') found = s;
  });
  return found ? JSON.parse(JSON.stringify(found)) : null;
}"""
# OPEN_WINDOW_JS, then: count every frame requestVideoFrameCallback reports and keep its metadata,
# count the steering pointer events the SDK listens to (InputCapture's choice of event), and
# keep the receiver's stats at the window's start
PROBE_OPEN_JS = f"""async () => {{
  await ({OPEN_WINDOW_JS})();
  const rs = window.renderStream, video = rs.video, inbound = {_INBOUND_JS};
  const inputEvent = 'onpointerrawupdate' in window ? 'pointerrawupdate' : 'pointermove';
  const probe = {{ t0: performance.now(), frames: 0, inputs: 0, inputEvent, counting: true,
    meta: [] }};
  probe.onInput = (e) => {{ if (probe.counting && (e.buttons & 1)) probe.inputs += 1; }};
  document.addEventListener(inputEvent, probe.onInput, true);
  const onFrame = (now, m) => {{
    if (!probe.counting) return;
    probe.frames += 1;
    if (probe.meta.length < 5000) {{
      probe.meta.push({{ now, presentationTime: m.presentationTime,
        expectedDisplayTime: m.expectedDisplayTime, receiveTime: m.receiveTime,
        rtpTimestamp: m.rtpTimestamp, captureTime: m.captureTime,
        processingDuration: m.processingDuration, mediaTime: m.mediaTime,
        presentedFrames: m.presentedFrames }});
    }}
    video.requestVideoFrameCallback(onFrame);
  }};
  video.requestVideoFrameCallback(onFrame);
  const receiver = rs.pc.getReceivers().find((r) => r.track && r.track.kind === 'video');
  probe.jitterBufferTarget = receiver && 'jitterBufferTarget' in receiver
    ? receiver.jitterBufferTarget : undefined;
  probe.stats0 = await inbound(rs.pc);
  window.__probe = probe;
}}"""
PROBE_CLOSE_JS = f"""async () => {{
  await ({CLOSE_WINDOW_JS})();
  const probe = window.__probe, inbound = {_INBOUND_JS};
  probe.t1 = performance.now();
  probe.counting = false;
  document.removeEventListener(probe.inputEvent, probe.onInput, true);
  probe.stats1 = await inbound(window.renderStream.pc);
}}"""
# SUMMARY_JS, with the probe's findings: how many frames carried each metadata field, and how
# the callbacks' times relate (medians, ms)
PROBE_SUMMARY_JS = f"""() => {{
  const summary = ({SUMMARY_JS})();
  const p = window.__probe, meta = p.meta;
  const median = (values) => {{
    const sorted = values.filter((v) => Number.isFinite(v)).sort((a, b) => a - b);
    return sorted.length ? sorted[Math.floor((sorted.length - 1) / 2)] : null;
  }};
  const fields = {{}};
  for (const name of {json.dumps(RVFC_FIELDS)}) {{
    fields[name] = meta.filter((m) => m[name] !== undefined && m[name] !== null).length;
  }}
  const steps = meta.slice(1).map((m, i) => m.presentedFrames - meta[i].presentedFrames);
  summary.probe = {{
    seconds: (p.t1 - p.t0) / 1000, frames: p.frames, inputs: p.inputs,
    inputEvent: p.inputEvent, jitterBufferTarget: p.jitterBufferTarget ?? null,
    sampled: meta.length, fields,
    expectedMinusPresentation: median(meta.map((m) => m.expectedDisplayTime - m.presentationTime)),
    expectedEqualsPresentation: meta.filter(
      (m) => m.expectedDisplayTime === m.presentationTime).length,
    presentationMinusNow: median(meta.map((m) => m.presentationTime - m.now)),
    presentationEqualsNow: meta.filter((m) => m.presentationTime === m.now).length,
    presentationMinusReceive: median(meta.map((m) => m.presentationTime - m.receiveTime)),
    processingMs: median(meta.map((m) => 1000 * m.processingDuration)),
    mediaTimeWhole: meta.filter((m) => Number.isInteger(m.mediaTime)).length,
    mediaTimeDistinct: new Set(meta.map((m) => m.mediaTime)).size,
    mediaTimeFirst: meta.length ? meta[0].mediaTime : null,
    presentedFramesStep: median(steps),
    stats0: p.stats0, stats1: p.stats1,
  }};
  return summary;
}}"""
CAMERA_YAW_JS = "return window.renderStream.command('getCamera').then((camera) => camera.yaw);"


# -- Firefox ----------------------------------------------------------------------------------


def _call(firefox: Firefox, function: str, timeout_s: float = 60.0) -> Any:
    """Call the page-side function expression `function` (as Playwright's `page.evaluate` does
    with one) in Firefox; a promise it returns is awaited."""
    return firefox.execute(f"return ({function})();", timeout_s=timeout_s)


def _wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.1)


def firefox_drag(
    firefox: Firefox, ms: float, width: int, height: int, share: float, sweep_ms: int, sign: int
) -> None:
    """Hold the left button at the middle of the page and sweep `share` of its width each way,
    back and forth, `sweep_ms` per sweep, for about `ms` (as `browser.drag`); the first sweep
    goes right (`sign` 1) or left (-1)."""
    x, y, swing = width / 2, height / 2, width * share
    sweeps = max(1, round(ms / sweep_ms))
    path = [(x + swing * (sign if n % 2 == 0 else -sign), y) for n in range(sweeps)]
    firefox.drag_over_time((x, y), path, sweep_ms)


def measure_in_firefox(
    url: str, seconds: float, viewport: tuple[int, int], first_moves: int
) -> dict[str, Any]:
    """As `measure_in_chromium` with this script's probe, in Firefox with stock preferences:
    the page's summary, with `codec`, `browser` and the worker's `yaw` before and after the
    drag."""
    width, height = viewport
    with launch_firefox(viewport=viewport) as firefox:
        try:
            firefox.navigate(url.rstrip("/") + "/")
            _wait_until(
                lambda: firefox.evaluate("document.body.dataset.state") == "streaming",
                STREAMING_TIMEOUT_MS / 1000, "the page to stream",
            )  # fmt: skip
            if not firefox.evaluate("typeof window.renderStream?.latency === 'function'"):
                raise RuntimeError("the page's SDK has no renderStream.latency()")
            codec = firefox.evaluate("window.renderStream.session?.codec || ''")
            if codec != CODEC:
                raise RuntimeError(f"stock Firefox was to get {CODEC}, its session has {codec!r}")
            firefox.wait(700)  # the SDK's first pings align the clocks
            yaw0 = float(firefox.execute(CAMERA_YAW_JS))
            _call(firefox, PROBE_OPEN_JS)
            firefox_drag(firefox, seconds * 1000, width, height, 1 / 6, SWEEP_MS, 1)
            _call(firefox, PROBE_CLOSE_JS)
            yaw1 = float(firefox.execute(CAMERA_YAW_JS))
            firefox.wait(600)  # the last timing records arrive
            if first_moves:
                firefox.execute("window.renderStream.firstMoveMeter.reset();")
                for n in range(first_moves):
                    firefox.wait(FIRST_MOVE_STILL_MS)
                    firefox_drag(
                        firefox, FIRST_MOVE_HOLD_MS, width, height, 1 / 12, FIRST_MOVE_LEG_MS,
                        1 if n % 2 == 0 else -1,
                    )  # fmt: skip
            summary: dict[str, Any] = _call(firefox, PROBE_SUMMARY_JS)
            summary["codec"] = firefox.evaluate("window.renderStream.session?.codec || ''")
            summary["browser"] = f"firefox {firefox.version}"
            summary["yaw"] = [yaw0, yaw1]
        finally:
            # end the session here: Firefox closes the page's socket before its pagehide
            with contextlib.suppress(Exception):
                firefox.execute("if (window.renderStream) window.renderStream.close('done');")
    return summary


def check_firefox(summary: dict[str, Any]) -> None:
    """That Firefox's drag really steered: the page saw the pointer events, the worker's camera
    turned, and the SDK's meter found input-to-photon samples, wherever Firefox's frames carry
    what it needs to match them with their records (`rtpTimestamp`, `receiveTime`); without
    those, the meter cannot see anything (its figures show "-", a note says why)."""
    probe = summary["probe"]
    fields, sampled = probe["fields"], probe["sampled"]
    if not probe["inputs"]:
        raise RuntimeError("Firefox's drag gave the page no steering pointer event")
    yaw0, yaw1 = summary["yaw"]
    if abs(yaw1 - yaw0) < 0.1:
        raise RuntimeError(f"Firefox's drag did not turn the camera (yaw {yaw0:.3f} → {yaw1:.3f})")
    matchable = sampled and fields["rtpTimestamp"] == sampled and fields["receiveTime"] == sampled
    if matchable and not summary["inputToPhoton"]["count"]:
        raise RuntimeError(
            "Firefox's frames carry rtpTimestamp and receiveTime, yet its latency summary has "
            f"no input-to-photon sample (matched {summary['matched']} of {summary['displayed']})"
        )


def notes(chromium: dict[str, Any], firefox: dict[str, Any]) -> list[str]:
    """What the probe found that changes how Firefox's row reads, each only where this run
    shows it."""
    out = []
    v, c = firefox["rvfc"], chromium["rvfc"]
    n = v["sampled"]
    missing = [k for k in ("rtpTimestamp", "receiveTime") if v["fields"][k] < n]
    if missing:
        out.append(
            f"Firefox's requestVideoFrameCallback metadata lacks {' and '.join(missing)} on "
            f"some of its {n} frames: the SDK's LatencyMeter skips those frames (it finds a "
            "frame's timing record by its RTP timestamp), so its figures cover "
            f'{firefox["matched"]} matched frames only, "-" where none.'
        )
    same = min(v["expectedEqualsPresentation"], v["presentationEqualsNow"])
    if n and same >= 0.9 * n:
        out.append(
            f"Firefox gives expectedDisplayTime = presentationTime = the callback's `now` on "
            f"{same} of its {n} frames (Gecko: a frame already composited is reported at the "
            "refresh tick that runs the callback): its display stage is 0 and its "
            "glass-to-glass and input-to-photon end at that tick, after the frame went to the "
            "compositor; "
            "Chromium's expectedDisplayTime is its estimate of the next refresh "
            f"({_ms(c['expectedMinusPresentation'])} ms from presentationTime here). The meter's "
            "jitterBuffer stage (presentationTime − receiveTime − decode: p50 "
            f"{_ms(chromium['jitterBuffer_p50'])} Chromium, {_ms(firefox['jitterBuffer_p50'])} "
            "Firefox) is each browser's way to its compositor more than its jitter buffer "
            f"(getStats' jitterBufferDelay means: {_ms(chromium['stats_jitter_buffer_ms'])} and "
            f"{_ms(firefox['stats_jitter_buffer_ms'])})."
        )
    first = firefox
    if (
        first["first_moves"] == 0
        and (first["first_moves_moving"] or first["first_moves_unchanged"])
        and v["mediaTimeDistinct"] <= 1
    ):
        out.append(
            f"Firefox's first moves: none measured ({first['first_moves_moving']} counted as "
            f"'moving', {first['first_moves_unchanged']} as 'unchanged'). Its callbacks' "
            f"mediaTime is {v['mediaTimeFirst']} on all {n} frames of the window (Chromium's: "
            f"{c['mediaTimeDistinct']} distinct values on {c['sampled']}), so "
            "client/first-move.js's check that "
            "the frame it reads is the callback's (mediaTime against VideoFrame.timestamp or "
            "currentTime) refuses every sample once the stream has played 1 s: no idle sample, "
            "so the picture never counts as still, and no sample while armed. An SDK defect."
        )
    return out


# -- both -------------------------------------------------------------------------------------


def busy_slots(url: str) -> int:
    """The worker slots that sessions hold (/api/workers)."""
    with urllib.request.urlopen(url.rstrip("/") + "/api/workers", timeout=5) as response:
        workers = json.loads(response.read())["workers"]
    return sum(int(w["slots"]) - int(w["free"]) for w in workers)


def _stats_mean(probe: dict[str, Any], total: str, count: str) -> float | None:
    """ms per frame of a getStats() total (seconds) over the window; None where absent."""
    before, after = probe.get("stats0") or {}, probe.get("stats1") or {}
    if total not in after or count not in after:
        return None
    frames = after[count] - before.get(count, 0)
    return 1000 * (after[total] - before.get(total, 0)) / frames if frames > 0 else None


def row(browser: str, summary: dict[str, Any]) -> dict[str, Any]:
    """The table's figures: benchmarks/latency.py's `figures`, with `shown` and `fps` the
    frames requestVideoFrameCallback reported in the window (the meter's own count needs
    rtpTimestamp and receiveTime), and the probe's findings."""
    probe = summary["probe"]
    summary["window"]["meter_shown"] = summary["window"]["shown"]
    summary["window"]["shown"] = probe["frames"]
    stats0, stats1 = probe.get("stats0") or {}, probe.get("stats1") or {}
    return {
        "browser": browser,
        "codec": summary.get("codec"),
        **figures(summary),
        "meter_shown": summary["window"]["meter_shown"],
        "matched": summary.get("matched"),
        "displayed": summary.get("displayed"),
        "inputs_per_s": probe["inputs"] / probe["seconds"] if probe["seconds"] else None,
        "input_event": probe["inputEvent"],
        "first_move_sample_ms": (summary.get("firstMove") or {}).get("sampleMs"),
        "stages_present": [k for k, v in summary["stages"].items() if v and v.get("count")],
        "rvfc": {k: v for k, v in probe.items() if k not in ("stats0", "stats1")},
        "stats_fields": {k: k in stats1 for k in STATS_FIELDS},
        "stats_jitter_buffer_ms": _stats_mean(
            probe, "jitterBufferDelay", "jitterBufferEmittedCount"
        ),
        "stats_decode_ms": _stats_mean(probe, "totalDecodeTime", "framesDecoded"),
        "stats_frames_decoded": (
            stats1["framesDecoded"] - stats0.get("framesDecoded", 0)
            if "framesDecoded" in stats1
            else None
        ),
        "yaw": summary.get("yaw"),
    }


def _ratio(value: float | None, base: float | None) -> str:
    return "-" if value is None or not base else f"{value / base:.2f}"


def table(spec: str, seconds: float, rows: list[dict[str, Any]], remarks: list[str]) -> str:
    base = rows[0]
    head = (
        f"{'browser':<22}{'shown':>6}{'fps':>6}{'in/s':>6}{'i2p p50':>9}{'g2g p50':>9}"
        f"{'g2g p95':>9}" + "".join(f"{s[:8]:>9}" for s in STAGES)
        + f"{'1st p50':>9}{'1st p95':>9}{'1st n':>6}{'unch':>5}{'mov':>5}"
        f"{'i2p/Cr':>8}{'1st/Cr':>8}"
    )  # fmt: skip
    lines = [
        f"{CODEC} {spec}, {seconds:g} s drag per browser (ms; shown = frames displayed in the "
        "drag window; in/s = steering pointer events; 1st = first move after stillness; "
        "ratios = Firefox / Chromium)",
        head,
    ]
    for r in rows:
        lines.append(
            f"{r['browser']:<22}{_count(r['shown']):>6}{_count(r['fps'], 1):>6}"
            f"{_count(r['inputs_per_s']):>6}{_ms(r['i2p_p50']):>9}{_ms(r['g2g_p50']):>9}"
            f"{_ms(r['g2g_p95']):>9}" + "".join(f"{_ms(r.get(f'{s}_p50')):>9}" for s in STAGES)
            + f"{_ms(r['first_move_p50']):>9}{_ms(r['first_move_p95']):>9}"
            f"{_count(r['first_moves']):>6}{_count(r['first_moves_unchanged']):>5}"
            f"{_count(r['first_moves_moving']):>5}"
            f"{_ratio(r['i2p_p50'], base['i2p_p50']):>8}"
            f"{_ratio(r['first_move_p50'], base['first_move_p50']):>8}"
        )  # fmt: skip
    for r in rows:
        v = r["rvfc"]
        n = v["sampled"]
        present = ", ".join(f"{k} {v['fields'][k]}/{n}" for k in RVFC_FIELDS)
        lines.append(
            f"{r['browser']}: requestVideoFrameCallback fields: {present}; expectedDisplayTime − "
            f"presentationTime p50 {_ms(v['expectedMinusPresentation'])} (equal on "
            f"{v['expectedEqualsPresentation']}/{n}); presentationTime − now p50 "
            f"{_ms(v['presentationMinusNow'])} (equal on {v['presentationEqualsNow']}/{n}); "
            f"presentationTime − receiveTime p50 {_ms(v['presentationMinusReceive'])}; "
            f"processingDuration p50 {_ms(v['processingMs'])}; mediaTime whole seconds on "
            f"{v['mediaTimeWhole']}/{n} ({v['mediaTimeDistinct']} distinct)"
        )
        have = ", ".join(k for k, ok in r["stats_fields"].items() if ok) or "none"
        lines.append(
            f"{'':<4}meter: {r['matched']} frames matched of {r['displayed']} it counted, "
            f"stages with samples: {', '.join(r['stages_present']) or 'none'}; input events: "
            f"{r['input_event']}; jitterBufferTarget {v['jitterBufferTarget']}; first-move "
            f"sample {_ms(r['first_move_sample_ms'])} ms"
        )
        lines.append(
            f"{'':<4}getStats over the window: {have}; jitter buffer mean "
            f"{_ms(r['stats_jitter_buffer_ms'])} ms, decode mean {_ms(r['stats_decode_ms'])} ms, "
            f"{_count(r['stats_frames_decoded'])} frames decoded"
        )
    lines.extend(f"note: {remark}" for remark in remarks)
    return "\n".join(lines)


def run(spec: str, seconds: float, first_moves: int, log_dir: Path) -> dict[str, Any]:
    size, fps_text = spec.split("@")
    width, height = (int(v) for v in size.split("x"))
    viewport = (width, height)
    with our_server(width, height, float(fps_text), log_dir) as url:
        # Firefox first: where it cannot start or steer, the run stops before Chromium's turn
        print(f"{spec} firefox {CODEC} ...", file=sys.stderr, flush=True)
        firefox = measure_in_firefox(url, seconds, viewport, first_moves)
        check_firefox(firefox)
        # its session was ended from the page; the slot is free at once
        _wait_until(lambda: busy_slots(url) == 0, SLOTS_FREE_TIMEOUT_S, "the worker's slot")
        print(f"{spec} chromium {CODEC} ...", file=sys.stderr, flush=True)
        chromium = measure_in_chromium(
            url, seconds, viewport=viewport, before_drag=PROBE_OPEN_JS,
            after_drag=PROBE_CLOSE_JS, summary_script=PROBE_SUMMARY_JS, first_moves=first_moves,
            codec=CODEC,
        )  # fmt: skip
        if chromium.get("codec") != CODEC:
            raise RuntimeError(f"Chromium asked for {CODEC}, got {chromium.get('codec')!r}")
        if not chromium["inputToPhoton"]["count"]:
            raise RuntimeError("Chromium's drag gave no input-to-photon sample")
    rows = [row("chromium", chromium), row(firefox["browser"], firefox)]
    return {
        "size": spec, "codec": CODEC, "seconds": seconds, "rows": rows,
        "notes": notes(rows[0], rows[1]),
    }  # fmt: skip


@contextlib.contextmanager
def _firefox_errors() -> Iterator[None]:
    """tests/firefox.py reports a Firefox that cannot start (or is not there) as a failed test
    (pytest.fail, a BaseException): here, one clear line and exit status 2."""
    try:
        yield
    except pytest.fail.Exception as error:
        print(f"firefox_latency: Firefox could not be used: {error}", file=sys.stderr)
        raise SystemExit(2) from None


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )  # fmt: skip
    parser.add_argument("--seconds", type=float, default=8.0, help="drag (window) per browser")
    parser.add_argument("--first-moves", type=int, default=20, help="per browser")
    parser.add_argument("--size", default="1280x720@30", help="WxH@fps (%(default)s)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    with _firefox_errors():
        firefox_path()  # before anything starts: no Firefox, no run
        with tempfile.TemporaryDirectory(prefix="firefox-latency-") as tmp:
            result = run(args.size, args.seconds, max(0, args.first_moves), Path(tmp))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(table(result["size"], result["seconds"], result["rows"], result["notes"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
