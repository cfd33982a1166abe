"""A shared session end to end, in real headless Chromium against `render-server serve`: the
owner shares it (the link, and its QR code read back by zbar), two viewers watch it, their input
is refused, the worker encodes each frame once for all three (its /metrics), control is handed to
a viewer and taken back, a viewer whose whole browser freezes slows nobody else and is let go,
the owner removes one viewer while the other watches on, and stopping sharing cuts the viewers
off and withdraws the link.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .browser import chromium_page, chromium_process, serve_process

pytestmark = pytest.mark.browser

FPS = 20
STREAMING = "body[data-state='streaming']"
DRAG = {"type": "pointer", "action": "move", "dx": 0.2, "dy": 0.0, "buttons": 1}


@pytest.fixture
def server_url(tmp_path: Path) -> Iterator[str]:
    with serve_process(
        "--resolution", "320x240", "--fps", str(FPS), "--max-viewers", "3",
        log_path=tmp_path / "serve.log",
    ) as url:  # fmt: skip
        yield url


def metric(url: str, name: str, labels: str = "") -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    pattern = rf"^{re.escape(name)}{re.escape('{' + labels + '}') if labels else ''} (\S+)$"
    found = re.search(pattern, text, re.M)
    return float(found.group(1)) if found else 0.0


def frames(page: Any) -> int:
    return int(page.evaluate("window.renderStream.stats().then(s => s.framesDecoded)"))


def camera(page: Any) -> Any:
    return page.evaluate("window.renderStream.command('getCamera')")


def raw_input_reply(page: Any) -> Any:
    """Send a drag straight on the page's data channel (past the SDK, which holds a non-
    steering page's input back) and return the worker's error reply, or None."""
    return page.evaluate(
        """(drag) => new Promise((resolve) => {
             const channel = window.renderStream.input;
             const onMessage = (event) => {
               const message = JSON.parse(event.data);
               if (message.type === 'error') { channel.removeEventListener('message', onMessage);
                                                resolve(message); }
             };
             channel.addEventListener('message', onMessage);
             channel.send(JSON.stringify(drag));
             setTimeout(() => resolve(null), 5000);
           })""",
        DRAG,
    )


def drag(page: Any) -> None:
    box = page.locator("video").first.bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(x, y)
    page.mouse.down()
    for step in range(1, 9):
        page.mouse.move(x + step * 12, y)
        page.wait_for_timeout(30)
    page.mouse.up()


def frame_rates(pages: list[Any], seconds: float) -> list[float]:
    before = [frames(p) for p in pages]
    t0 = time.monotonic()
    pages[0].wait_for_timeout(seconds * 1000)
    elapsed = time.monotonic() - t0
    return [(frames(p) - b) / elapsed for p, b in zip(pages, before, strict=True)]


def read_qr(image: Path) -> str:
    zbarimg = shutil.which("zbarimg")
    if zbarimg is None:
        pytest.fail("zbarimg is missing: install Debian's zbar-tools (the README's command does)")
    done = subprocess.run(
        [zbarimg, "--raw", "-q", str(image)], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, f"zbar read no QR code: {done.stderr}"
    return done.stdout.strip()


def watch(browser: Any, link: str, name: str) -> Any:
    page = browser.new_context(viewport={"width": 480, "height": 360}).new_page()
    page.on("console", lambda m: print(f"[{name} {m.type}] {m.text}"))
    page.goto(link.replace("/#", f"/?name={name}#"))
    page.wait_for_selector(STREAMING, state="attached", timeout=30_000)
    return page


def test_two_viewers_watch_one_encode_and_a_frozen_viewer_slows_nobody(
    server_url: str, tmp_path: Path, output_dir: Path
) -> None:
    with chromium_page(960, 600) as owner:
        owner.goto(server_url + "/")
        owner.wait_for_selector(STREAMING, state="attached", timeout=30_000)

        # -- the link, and its QR code as a phone's camera would read it
        owner.click("#share-button")
        owner.wait_for_function(
            "() => (document.getElementById('share-link')?.value || '').includes('#watch=')"
        )
        link = owner.input_value("#share-link")
        assert link.startswith(server_url + "/#watch="), link
        qr = tmp_path / "share-qr.png"
        owner.locator("#share-qr-image").screenshot(path=str(qr))
        assert read_qr(qr) == link
        owner.screenshot(path=str(output_dir / "share-owner.png"))
        owner.click("#share-close")

        browser = owner.context.browser
        bob, carol = watch(browser, link, "Bob"), watch(browser, link, "Carol")
        for viewer in (bob, carol):
            viewer.wait_for_function(
                "() => /is steering/.test(document.getElementById('presence-status').textContent)"
            )
            assert viewer.evaluate("window.renderStream.steering") is False
        owner.wait_for_function("() => document.querySelectorAll('#presence-list li').length === 3")
        bob.screenshot(path=str(output_dir / "share-viewer.png"))

        # -- a viewer's input is refused, and the camera stays where the owner left it
        still = camera(owner)
        refused = raw_input_reply(bob)
        assert refused is not None and refused["code"] == "forbidden", refused
        drag(carol)  # through the page: the SDK does not even send it
        owner.wait_for_timeout(400)
        assert camera(owner) == still

        # -- one encode for three peers: the worker's counters and what each browser decoded;
        # the owner keeps the camera moving, so that every tick is a new frame (the SDK holds
        # this back while a viewer steers)
        moving = owner.evaluate(
            """() => setInterval(() => window.renderStream.sendInput(
                 {type: 'pointer', action: 'move', dx: 0.01, dy: 0, buttons: 1}), 50)"""
        )
        pages = [owner, bob, carol]
        encoded0 = metric(server_url, "worker_frames_encoded_total")
        sent0 = metric(server_url, "worker_viewer_frames_total", 'outcome="sent"')
        decoded0 = [frames(p) for p in pages]
        owner.wait_for_timeout(4000)
        encoded = metric(server_url, "worker_frames_encoded_total") - encoded0
        sent = metric(server_url, "worker_viewer_frames_total", 'outcome="sent"') - sent0
        decoded = [frames(p) - d for p, d in zip(pages, decoded0, strict=True)]
        print(f"encoded {encoded:.0f}, sent to viewers {sent:.0f}, decoded {decoded}")
        assert encoded >= 3 * FPS, encoded  # a moving picture: about 4 s of frames
        assert 1.8 * encoded <= sent <= 2 * encoded + 4, (encoded, sent)
        for count in decoded:
            assert count >= 0.7 * encoded, (decoded, encoded)

        # -- control handed to Bob, then taken back
        bob_id = bob.evaluate("window.renderStream.viewerId")
        owner.click(f"button.hand-control[data-peer='{bob_id}']")
        bob.wait_for_function("() => window.renderStream.steering === true")
        carol.wait_for_function(
            "() => /Bob is steering/.test(document.getElementById('presence-status').textContent)"
        )
        owner.wait_for_timeout(300)  # the owner's last moves are applied
        before = camera(owner)
        drag(bob)
        owner.wait_for_function(
            "(before) => window.renderStream.command('getCamera').then("
            "c => JSON.stringify(c) !== JSON.stringify(before))",
            arg=before,
            timeout=5000,
        )
        assert raw_input_reply(owner)["code"] == "forbidden"  # the owner waits its turn
        owner.click("#take-control")
        owner.wait_for_function("() => window.renderStream.steering === true")
        bob.wait_for_function("() => window.renderStream.steering === false")

        # -- a third viewer in a browser of its own, frozen whole: nobody else slows down
        chromium = browser.browser_type
        with chromium_process(tmp_path / "frozen", 480, 360, chromium) as dave:
            dave.goto(link.replace("/#", "/?name=Dave#"))
            dave.wait_for_selector(STREAMING, state="attached", timeout=30_000)
            assert metric(server_url, "worker_viewers") == 3
            baseline = frame_rates(pages, 4)
            os.killpg(dave.pgid, signal.SIGSTOP)
            frozen = frame_rates(pages, 6)
            print(f"fps with Dave watching {baseline}, with Dave frozen {frozen}")
            for fps_before, fps_frozen in zip(baseline, frozen, strict=True):
                assert fps_frozen >= min(0.75 * fps_before, 0.6 * FPS), (baseline, frozen)
            # no RTCP from Dave for 10 s: the worker lets him go, the others stream on
            deadline = time.monotonic() + 30
            while metric(server_url, "worker_viewers") != 2:
                assert time.monotonic() < deadline, "the frozen viewer was never let go"
                owner.wait_for_timeout(500)
            owner.evaluate("(id) => clearInterval(id)", moving)
            assert all(p.evaluate("document.body.dataset.state") == "streaming" for p in pages)

        # -- the owner removes Carol: her stream ends for good, Bob's goes on
        carol_id = carol.evaluate("window.renderStream.viewerId")
        owner.click(f"button.remove-viewer[data-peer='{carol_id}']")
        carol.wait_for_function("() => window.renderStream.state === 'error'")
        assert carol.text_content("#status") == "The owner removed you from this session."
        owner.wait_for_function("() => document.querySelectorAll('#presence-list li').length === 2")
        assert metric(server_url, "worker_viewers") == 1
        assert metric(server_url, "worker_viewers_removed_total") == 1
        carol.wait_for_timeout(1500)  # past the first reconnect's backoff: she stays out
        assert carol.evaluate("window.renderStream.state") == "error"
        assert metric(server_url, "worker_viewers") == 1
        before = frames(bob)
        bob.wait_for_function("(n) => window.renderStream.stats().then(s => s.framesDecoded > n)",
                              arg=before + 5, timeout=10_000)  # fmt: skip

        # -- the owner stops sharing: the viewers are cut off and the link opens nothing
        owner.click("#share-button")
        owner.click("#share-stop")
        owner.wait_for_function(
            "() => /Sharing stopped/.test(document.getElementById('share-panel').textContent)"
        )
        for viewer in (bob,):
            viewer.wait_for_function("() => window.renderStream.state === 'error'")
            assert "stopped sharing" in (viewer.text_content("#status") or "")
        late = browser.new_context().new_page()
        late.goto(link)
        late.wait_for_function("() => window.renderStream.state === 'error'")
        assert "expired or is not valid" in (late.text_content("#status") or "")
        assert owner.evaluate("window.renderStream.state") == "streaming"
