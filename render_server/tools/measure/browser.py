"""Latency as a browser sees it: headless Chromium on the server's page, through Playwright.

The page's SDK matches the worker's timing records with the frames Chromium displays
(`requestVideoFrameCallback`) and sums them up in `window.renderStream.latency()`; this drives
the page (a left-button drag across the video, back and forth, for the whole run) and reads
that summary. Then it makes `first_moves` short drags, each after the picture has been still
for longer than the SDK's STILL_MS, for the SDK's pixel meter (client/first-move.js): from the
first move's input event to the first displayed frame whose pixels changed, reported in the
summary's `firstMove`. Playwright is imported only here, and only when used.
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Any

from render_server.tools.measure.client import MeasureError

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
# A closed network refuses Chromium's background connections; these flags keep it quiet.
CHROMIUM_ARGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--autoplay-policy=no-user-gesture-required",
)
STREAMING_TIMEOUT_MS = 30_000
# Before each first move: more than the SDK's STILL_MS (500), and long enough for the encoder to
# stop refining the still picture (its repeats kept changing pixels 0.4-0.7 s after a drag, and
# with 0.7 s the meter counted one run in three's moves as `moving`, not measured)
FIRST_MOVE_STILL_MS = 1500
FIRST_MOVE_HOLD_MS = 300  # the short drag after it, then the button is released
# A JS function of the page's latency meter frames: each one's stages that its codec lengthens
# (encoding, pacing its packets, carrying them, decoding), summed. Steadier between windows than
# input-to-photon, whose tick wait and jitter-buffer wait trade places with the drag's phase.
CODEC_STAGES_JS = """(frames) => frames
  .filter((f) => ['encode', 'send', 'network', 'decode'].every((k) => Number.isFinite(f.stages[k])))
  .map((f) => f.stages.encode + f.stages.send + f.stages.network + f.stages.decode)"""


def find_chromium() -> str:
    """$CHROMIUM_PATH, else the first Chromium installed in the usual places."""
    path = os.environ.get("CHROMIUM_PATH") or next(
        (p for p in CHROMIUM_CANDIDATES if shutil.which(p)), None
    )
    if path is None:
        raise MeasureError("no Chromium found: install chromium or set CHROMIUM_PATH")
    return path


def _sync_playwright() -> Any:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise MeasureError(
            "--client chromium needs Playwright: pip install playwright (Chromium itself "
            "comes from the system, see CHROMIUM_PATH)"
        ) from None
    return sync_playwright


def measure_in_chromium(
    url: str,
    seconds: float = 10.0,
    token: str | None = None,
    viewport: tuple[int, int] = (1280, 720),
    before_drag: str | None = None,
    after_drag: str | None = None,
    summary_script: str = "window.renderStream.latency()",
    first_moves: int = 20,
    codec: str | None = None,
) -> dict[str, Any]:
    """Open the page at `url` in headless Chromium, drag for `seconds`, then make
    `first_moves` short drags after stillness; return the page's `renderStream.latency()`
    summary, with `codec`: the codec the stream arrived in. `codec` asks for one (the page's
    `?codec=`; default: the SDK's choice). Blocking: call it off the event loop.

    A benchmark's hooks, each a script the page evaluates (Playwright's `page.evaluate`):
    `before_drag` once the page streams and its clocks are aligned, `after_drag` as soon as
    the drag ends, `summary_script` (what is returned) once the last timing records came in
    and the first moves were made.
    """
    sync_playwright = _sync_playwright()
    executable = find_chromium()
    query = f"?codec={codec}" if codec else ""
    target = url.rstrip("/") + "/" + query + (f"#token={token}" if token else "")
    width, height = viewport
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=executable, headless=True, args=list(CHROMIUM_ARGS)
        )
        try:
            page = browser.new_context(viewport={"width": width, "height": height}).new_page()
            page.goto(target)
            page.wait_for_selector(
                "body[data-state='streaming']", state="attached", timeout=STREAMING_TIMEOUT_MS
            )
            if not page.evaluate("typeof window.renderStream?.latency === 'function'"):
                raise MeasureError("the page's SDK has no renderStream.latency()")
            page.wait_for_timeout(700)  # the SDK's first pings align the clocks
            if before_drag is not None:
                page.evaluate(before_drag)
            drag(page, seconds, width, height)
            if after_drag is not None:
                page.evaluate(after_drag)
            page.wait_for_timeout(600)  # the last timing records arrive
            if first_moves:
                page.evaluate("window.renderStream.firstMoveMeter.reset()")
                first_move_drags(page, first_moves, width, height)
            summary: dict[str, Any] = page.evaluate(summary_script)
            if isinstance(summary, dict):
                summary["codec"] = page.evaluate("window.renderStream.session?.codec || ''")
        finally:
            browser.close()
    if not summary.get("frames"):
        raise MeasureError("Chromium displayed no frame with a timing record")
    return summary


def drag(
    page: Any,
    seconds: float,
    width: int,
    height: int,
    swing_share: float = 1 / 6,
    steps: int = 12,
    direction: int = 1,
) -> None:
    """Hold the left button and sweep across the middle of a `width` × `height` Playwright
    page, `swing_share` of its width each way in `steps` moves, back and forth, for `seconds`;
    the first sweep goes right (`direction` 1) or left (-1)."""
    x, y, swing = width / 2, height / 2, width * swing_share
    page.mouse.move(x, y)
    page.mouse.down()
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            page.mouse.move(x + swing * direction, y, steps=steps)
            direction = -direction
    finally:
        page.mouse.up()


def first_move_drags(page: Any, count: int, width: int, height: int) -> None:
    """`count` short left-button drags across the middle of the page, each after
    FIRST_MOVE_STILL_MS without input, alternating in direction so the picture stays framed."""
    for n in range(count):
        page.wait_for_timeout(FIRST_MOVE_STILL_MS)
        drag(page, FIRST_MOVE_HOLD_MS / 1000, width, height, 1 / 12, 6, 1 if n % 2 == 0 else -1)
