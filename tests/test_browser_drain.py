"""A drain as the designer sees it, in Chromium: the worker streaming to the page is drained
(`POST /api/workers/{id}/drain`), the SDK hears `session.moving`, keeps the last frame on
screen, and streams from the other worker with the same camera pose."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .browser import serve_process
from .test_browser_client import STREAMING, chromium, new_page, wait_until

__all__ = ["chromium"]  # the module's fixture, shared

SIZE = ("--resolution", "320x180", "--fps", "15")


def api(url: str, path: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    method = "GET" if body is None else "POST"
    request = urllib.request.Request(url + path, data=data, method=method, headers=headers)
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


@pytest.fixture
def two_workers(tmp_path: Path) -> Iterator[str]:
    """`serve` (its own worker) and a second worker process on it, one slot each."""
    with serve_process(*SIZE, "--slots", "1", log_path=tmp_path / "serve.log") as url:
        port = url.rstrip("/").rsplit(":", 1)[1]
        with open(tmp_path / "worker.log", "wb") as log:
            worker = subprocess.Popen(
                [sys.executable, "-m", "render_server", "worker", *SIZE, "--slots", "1",
                 "--signaling", f"ws://127.0.0.1:{port}/worker", "--worker-id", "second",
                 "--renderer", "cpu", "--encoder", "x264", "--drain-timeout", "2"],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        try:
            wait_until(lambda: len(api(url, "/api/workers")["workers"]) == 2, 60, "two workers")
            yield url
        finally:
            worker.terminate()
            worker.wait(15)


def test_a_drained_worker_hands_the_page_to_another_without_a_black_picture(
    chromium: Any, two_workers: str
) -> None:
    page = new_page(chromium)
    page.goto(two_workers + "/")
    page.wait_for_selector(STREAMING, state="attached", timeout=30_000)
    page.evaluate("""() => {
      window.seen = [];
      const freeze = document.querySelector('.render-stream-freeze');
      window.renderStream.addEventListener('state', ({ detail }) => {
        window.seen.push([detail.state, detail.reason, freeze.style.display]);
      });
      // the last frame held on screen while the new peer connects
      new MutationObserver(() => window.seen.push(['freeze', '', freeze.style.display]))
        .observe(freeze, { attributes: true, attributeFilter: ['style'] });
    }""")
    pose = page.evaluate("window.renderStream.command('setCamera', {yaw: 1.25, pitch: 0.4})")
    first = page.evaluate("window.renderStream.session.workerId")

    drained = time.monotonic()
    assert api(two_workers, f"/api/workers/{first}/drain", {})["draining"] is True
    wait_until(
        lambda: page.evaluate("window.renderStream.session.workerId") != first
        and page.evaluate("window.renderStream.state") == "streaming",
        20, "the page streams from the other worker",
    )  # fmt: skip
    moved_s = time.monotonic() - drained
    seen = page.evaluate("window.seen")
    print(f"moved in {moved_s:.2f} s: {seen}")
    assert ["reconnecting", "worker_draining"] == seen[0][:2]
    assert ["freeze", "", "block"] in seen, seen  # never a black picture in between
    states = [entry for entry in seen if entry[0] != "freeze"]
    freezes = [entry[2] for entry in seen if entry[0] == "freeze"]
    assert states[-1][0] == "streaming" and freezes[-1] == "none"  # the live picture again
    # the draining worker's frames never made the page `streaming` before the move was done
    assert [state for state, *_ in states] == ["reconnecting", "streaming"], seen
    after = page.evaluate("window.renderStream.command('getCamera')")
    assert after == pose  # the camera moved with the session
    page.context.close()
