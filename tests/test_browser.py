"""End to end in real headless Chromium: `render-server serve`, the page, the stream, the mouse."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from .browser import chromium_page, serve_process

pytestmark = pytest.mark.browser

WIDTH, HEIGHT = 1280, 720  # what `serve` streams by default

# Draws the current video frame to a canvas and returns it, downscaled, as a flat RGBA list.
GRAB_JS = """
() => {
  const video = document.getElementById('video');
  const canvas = document.createElement('canvas');
  canvas.width = 160; canvas.height = 90;
  const ctx = canvas.getContext('2d', { willReadFrequently: true });
  ctx.drawImage(video, 0, 0, canvas.width, canvas.height);
  return Array.from(ctx.getImageData(0, 0, canvas.width, canvas.height).data);
}
"""


@pytest.fixture(scope="module")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with serve_process("--resolution", f"{WIDTH}x{HEIGHT}", "--fps", "30", log_path=log) as url:
        yield url


@pytest.fixture
def page(server_url: str) -> Iterator[Any]:
    with chromium_page() as page:
        yield page


def grab(page: Any) -> np.ndarray:
    return np.array(page.evaluate(GRAB_JS), dtype=np.int16).reshape(90, 160, 4)[..., :3]


def settled_grab(page: Any, seconds: float = 0.6) -> np.ndarray:
    page.wait_for_timeout(seconds * 1000)
    return grab(page)


def test_page_streams_and_the_mouse_steers_the_camera(
    page: Any, server_url: str, output_dir: Path
) -> None:
    opened = time.monotonic()
    page.goto(server_url + "/")
    page.wait_for_selector("body[data-state='streaming']", state="attached", timeout=15_000)
    time_to_stream = time.monotonic() - opened
    print(f"time from page load to first frame playing: {time_to_stream:.2f}s")

    # 5 s after the page opened: at least 60 frames decoded, at the configured size
    page.wait_for_timeout(max(0.0, 5.0 - (time.monotonic() - opened)) * 1000)
    stats = page.evaluate("window.renderStream.stats()")
    print(f"stats after 5 s: {stats}")
    assert stats["framesDecoded"] >= 60, stats
    assert (stats["width"], stats["height"]) == (WIDTH, HEIGHT)
    assert stats["codec"] == "H264"

    # the overlay shows live figures
    page.wait_for_function(
        "() => document.getElementById('stat-fps').textContent !== '–'", timeout=5_000
    )
    session_id = page.evaluate("window.renderStream.session.sessionId")
    assert page.text_content("#stat-session") == session_id[:8]
    assert page.text_content("#stat-resolution") == f"{WIDTH}×{HEIGHT}"
    assert page.text_content("#stat-codec") == "H264"
    assert float(page.text_content("#stat-fps") or 0) > 10
    page.screenshot(path=str(output_dir / "browser-streaming.png"))

    before = settled_grab(page)
    assert before.std() > 10, "the picture is blank"
    again = settled_grab(page)
    assert np.abs(before - again).mean() < 2.0, "a still camera must give a still picture"

    box = page.locator("#stage").bounding_box()
    cx, cy = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(cx, cy)
    page.mouse.down()
    page.mouse.move(cx + 240, cy + 40, steps=12)
    page.mouse.up()
    orbited = settled_grab(page)
    print(f"mean pixel change after drag: {np.abs(before - orbited).mean():.1f}")
    assert np.abs(before - orbited).mean() > 5.0, "the drag did not change the picture"
    page.screenshot(path=str(output_dir / "browser-after-drag.png"))

    page.mouse.wheel(0, -600)  # zoom in
    zoomed = settled_grab(page)
    assert np.abs(orbited - zoomed).mean() > 5.0, "the wheel did not change the picture"

    page.keyboard.down("KeyW")
    page.wait_for_timeout(400)
    page.keyboard.up("KeyW")
    moved = settled_grab(page)
    assert np.abs(zoomed - moved).mean() > 3.0, "holding W did not move the camera"

    page.mouse.move(cx, cy)
    page.mouse.down(button="right")
    page.mouse.move(cx - 150, cy, steps=8)
    page.mouse.up(button="right")
    panned = settled_grab(page)
    assert np.abs(moved - panned).mean() > 3.0, "right-drag did not pan"
    page.screenshot(path=str(output_dir / "browser-after-input.png"))
    assert page.evaluate("document.body.dataset.state") == "streaming"

    # Chromium's transport-cc feedback reached the worker's congestion controller (with
    # transport-cc negotiated Chromium sends no REMB), whose figures reached the page
    with urllib.request.urlopen(server_url + "/metrics", timeout=5) as response:
        metrics = response.read().decode()
    feedback = next(
        line for line in metrics.splitlines() if line.startswith("worker_transport_feedback_total")
    )
    print(f"from Chromium: {feedback}")
    assert float(feedback.split()[1]) > 20  # ~every 50-100 ms for several seconds
    network = page.evaluate("window.renderStream.network")
    assert network["mode"] == "transport-cc" and network["targetKbps"] > 0, network
    assert network["estimateKbps"] >= network["targetKbps"], network
    assert 0 <= network["pathQueueMs"] < 30, network  # loopback: nothing stands in a queue
    assert page.text_content("#stat-estimate") not in ("", "–")
