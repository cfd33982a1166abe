"""A bandwidth step in the network lab with Chromium dragging all along: 20 → 2 → 20 Mbit/s
at 40 ms RTT, and what the stream did (frames shown, glass-to-glass, the encoder's target) as
time series. Used by tests/test_congestion_lab.py (loose bounds), benchmarks/network.py (the
issue's figures and plot) and tests/record_congestion.py (recordings for replay tests).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .netlab import ROOT, SHOWN_CLOSE_JS, LinkProfile, NetLab

HIGH = LinkProfile(rtt_ms=40, rate_kbit=20000)
LOW = LinkProfile(rtt_ms=40, rate_kbit=2000)
STREAM = ("--renderer", "cpu", "--resolution", "1280x720", "--fps", "30")
START_S = 2.0  # the page's own start-up and clock pings (~1 s) before the first period counts

# the page keeps every displayed frame's wall-clock time and its glass-to-glass (the meter's
# frames, stamped as benchmarks/latency.py's window does), for a timeline
STEP_OPEN_JS = """() => {
  const rs = window.renderStream, m = rs.latencyMeter, video = rs.video;
  window.__shown = [];
  window.__t0 = performance.now();
  const tick = (now) => {
    window.__shown.push(performance.timeOrigin + now); video.requestVideoFrameCallback(tick);
  };
  video.requestVideoFrameCallback(tick);
  const breakdown = m._breakdown.bind(m);
  m._breakdown = (shown, row, offset) => Object.assign(breakdown(shown, row, offset),
    { wall: performance.timeOrigin + shown.expectedDisplayTime });
  m._push = (frame) => { m.frames.push(frame); };
  m.frames = [];
}"""
STEP_SUMMARY_JS = """() => ({
  shown: window.__shown, t0: window.__t0, t1: window.__t1,
  frames: window.renderStream.latencyMeter.frames.length,
  g2g: window.renderStream.latencyMeter.frames.map((f) => [f.wall, f.glassToGlass]),
  stages: window.renderStream.latencyMeter.frames.map(
    (f) => [f.wall, f.bytes, f.keyframe, f.stages]),
  network: window.renderStream.network,
})"""
# polls the worker's /metrics (its encoders' target)
POLLER = """
import sys, time, urllib.request
url, every, until = sys.argv[1], float(sys.argv[2]), time.time() + float(sys.argv[3])
while time.time() < until:
    try:
        text = urllib.request.urlopen(url, timeout=1).read().decode()
        value = next(float(line.split()[-1]) for line in text.splitlines()
                     if line.startswith("worker_encoder_bitrate_bps "))
        print(f"{time.time() * 1000:.0f} {value:.0f}", flush=True)
    except Exception:
        pass
    time.sleep(every)
"""


def run_step(
    path: str,
    before_s: float,
    low_s: float,
    after_s: float,
    port: int = 8080,
    record_dir: Path | None = None,
    options: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Chromium dragging all along while the link steps HIGH → LOW → HIGH, the worker on
    send path `path`; `timeline`'s figures, plus `monotonic_steps` (the step times on the
    machine's monotonic clock, which a recording's times share) and the page's last
    `network` message. `options`: more of `render-server serve`'s."""
    total = before_s + low_s + after_s
    extra = ["--record-congestion", str(record_dir)] if record_dir is not None else []
    with NetLab(HIGH) as lab:
        url = lab.serve(port, *STREAM, "--send-path", path, *extra, *options)
        # on the server's host: a poll across the stepped link would wait in its queue
        poller = lab.popen(
            "server", [sys.executable, "-c", POLLER, url + "/metrics", "0.25", str(total + 20)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        argv = lab.chromium_argv(
            url, total + START_S, (1280, 720), STEP_OPEN_JS, SHOWN_CLOSE_JS, STEP_SUMMARY_JS
        )
        page = lab.popen(
            "client", argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT
        )
        # the drag starts once the page streams: wait for the first encoder figure, then time
        assert poller.stdout is not None
        first = poller.stdout.readline()
        steps: list[tuple[float, str]] = [(time.time() * 1000, "20 Mbit/s")]
        time.sleep(before_s + START_S)
        lab.set_profile(LOW)
        steps.append((time.time() * 1000, "2 Mbit/s"))
        monotonic = [time.monotonic()]
        time.sleep(low_s)
        lab.set_profile(HIGH)
        steps.append((time.time() * 1000, "20 Mbit/s"))
        monotonic.append(time.monotonic())
        out, err = page.communicate(timeout=total + 120)
        poller.terminate()
        rest, _ = poller.communicate(timeout=10)
    if page.returncode != 0:
        raise RuntimeError(f"Chromium in the lab: {err[-1500:]}")
    summary = json.loads(out)
    bitrate = [tuple(map(float, line.split())) for line in (first + rest).splitlines() if line]
    result = timeline(summary["shown"], summary["g2g"], bitrate, steps)
    result["monotonic_steps"] = monotonic
    result["network"] = summary.get("network")
    down = steps[1][0]  # each frame's stages (ms), its bytes and whether a keyframe, for a look
    result["stages"] = [((w - down) / 1000, *rest) for w, *rest in summary["stages"] if w]
    return result


def timeline(
    shown: list[float],
    g2g: list[list[float]],
    bitrate: list[tuple[float, ...]],
    steps: list[tuple[float, str]],
) -> dict[str, Any]:
    """Seconds from the step down: each frame's gap to the one before, glass-to-glass, the
    encoder's target; and the issue's figures read off them."""
    down, up = steps[1][0], steps[2][0]
    rel = lambda wall: (wall - down) / 1000  # noqa: E731
    frames = [(rel(b), b - a) for a, b in zip(shown, shown[1:], strict=False)]
    latency = [(rel(wall), ms) for wall, ms in g2g if wall]
    target = [(rel(at), bps) for at, bps in bitrate]
    step_up = (up - down) / 1000
    after_down = [(t, g) for t, g in frames if 0 <= t <= step_up]
    under = next((t for t, bps in target if t >= 0 and bps <= 2_000_000), None)
    high_before = max((bps for t, bps in target if t < 0), default=0.0)
    back_up = next((t for t, bps in target if t >= step_up and bps >= 0.9 * high_before), None)
    settled = next(
        (t for t, _ in latency
         if 0 <= t <= step_up and all(ms < 100 for u, ms in latency if t <= u <= step_up)),
        None,
    )  # fmt: skip
    return {
        "frames": frames,
        "latency": latency,
        "target": target,
        "step_up_s": step_up,
        "longest_gap_after_step_ms": max((g for _, g in after_down), default=0.0),
        "longest_gap_ms": max((g for t, g in frames if t >= -1), default=0.0),
        "target_under_2mbit_after_s": under,
        "latency_under_100ms_from_s": settled,
        "target_back_to_90pct_after_step_up_s": None if back_up is None else back_up - step_up,
        "target_before_bps": high_before,
        "target_end_bps": target[-1][1] if target else 0.0,
    }
