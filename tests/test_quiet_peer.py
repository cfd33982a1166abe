"""A browser that freezes whole (SIGSTOP: a hung tab, a laptop whose lid closed, a crash the OS
has not reaped) sends no RTCP: its session stops rendering and encoding after PEER_QUIET_S
instead of streaming to nobody until it is let go (PEER_SILENT_S), and once the browser runs
again the frames come back, from a keyframe, on the same session."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from render_server.stream.path_control import PEER_SILENT_S
from render_server.stream.quiet_peer import PEER_QUIET_S

from .browser import chromium_process, serve_process
from .test_sharing_browser import STREAMING, metric

pytestmark = pytest.mark.browser

FRAMES = "worker_frames_encoded_total"
KEYFRAMES_DECODED = """() => window.renderStream.pc.getStats().then((stats) => {
  let n = 0; stats.forEach((r) => { if (r.type === 'inbound-rtp' && r.kind === 'video')
    n = r.keyFramesDecoded; }); return n; })"""


def wait_for(check: Callable[[], bool], seconds: float, what: str) -> float:
    """Poll `check` until it holds; how long that took."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < seconds, f"{what}: not within {seconds} s"
        time.sleep(0.2)
    return time.monotonic() - start


def test_a_frozen_browsers_session_makes_no_frames_and_resumes_when_it_wakes(
    tmp_path: Path,
) -> None:
    with (
        serve_process("--resolution", "320x240", "--fps", "20", log_path=tmp_path / "serve.log")
        as url,
        chromium_process(tmp_path / "chromium", 480, 360) as page,
    ):  # fmt: skip
        page.goto(url + "/")
        page.wait_for_selector(STREAMING, state="attached", timeout=30_000)
        start = metric(url, FRAMES)
        wait_for(lambda: metric(url, FRAMES) > start + 10, 10, "frames streamed")
        keyframes: Any = page.evaluate(KEYFRAMES_DECODED)

        os.killpg(page.pgid, signal.SIGSTOP)
        frozen_at = time.monotonic()
        took = wait_for(
            lambda: metric(url, "worker_session_pauses_total") == 1, PEER_QUIET_S + 4, "paused"
        )
        print(f"paused {took:.1f} s after the browser froze")
        at_pause = metric(url, FRAMES)
        time.sleep(0.5)  # a frame being made as the pause came is finished and counted
        paused = metric(url, FRAMES)
        assert paused - at_pause <= 1
        time.sleep(2)
        assert metric(url, FRAMES) == paused  # nothing rendered or encoded for nobody
        assert time.monotonic() - frozen_at < PEER_SILENT_S - 1  # not yet let go

        os.killpg(page.pgid, signal.SIGCONT)
        took = wait_for(lambda: metric(url, FRAMES) > paused + 10, 6, "frames again")
        print(f"streaming again {took:.1f} s after the browser woke")
        page.wait_for_function(f"(n) => ({KEYFRAMES_DECODED})().then((k) => k > n)", arg=keyframes)
        assert page.evaluate("document.body.dataset.state") == "streaming"
        assert (
            metric(url, "sessions_active") == 1 and metric(url, "worker_session_pauses_total") == 1
        )
