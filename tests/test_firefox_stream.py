"""The stream end to end in real Firefox: Debian's firefox-esr, headless, through Marionette
(tests/firefox.py), against `render-server serve` as a user runs it.

Firefox matters on its own because it takes another codec path than Chromium: Debian's
firefox-esr offers no H.264 to WebRTC with stock preferences (Firefox's H.264 for WebRTC is either
the OpenH264 plug-in, which it would download, or a platform codec it only offers where the GPU
blocklist clears WEBRTC_HW_ACCELERATION_H264), so the SDK asks for VP8 and AV1 and the worker
sends VP8. These tests check that the designer page, the embed and every example page play that
stream (frames shown, VP8 named), that a real mouse drag turns the camera, and that with H.264
enabled by preferences the same page plays H.264.

One Firefox (stock PREFS) and one server serve the whole module; each test closes the streams it
opened before the next one starts (see `browser`), so that no test waits in the worker's queue
behind an earlier one's session.
"""

from __future__ import annotations

import base64
import json
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.browser import ROOT, chromium_page, serve_process
from tests.firefox import Firefox, launch_firefox
from tests.support import eventually
from tests.test_scene_upload_browser import magenta_ball_glb, magenta_share

WIDTH, HEIGHT = 640, 360  # what the server streams: small, to leave the two cores some room
VIEWPORT = (960, 540)
STREAMING_TIMEOUT_S = 20.0
FRAMES_WINDOW_MS = 1500
# frames Firefox must show in FRAMES_WINDOW_MS: the worker sends 30 fps while the camera moves and
# fewer while it is still (10 to 16 a second here while Firefox and the worker share two cores);
# a stream that stalls or never decodes shows none
MIN_FRAMES = 6

# The stream in the page or in one of its same-origin frames: the designer's and the embed's
# `window.renderStream`, or the `stream` of a <render-stream> element. A function body: its
# `stream` constant is null until one exists.
FIND_STREAM = """
const frames = Array.from(document.querySelectorAll('iframe'), (frame) => {
  try { return frame.contentWindow.document ? frame.contentWindow : null; } catch { return null; }
});
const stream = [window, ...frames.filter(Boolean)].map((w) => w.renderStream
  || Array.from(w.document.querySelectorAll('render-stream'), (element) => element.stream)
    .find(Boolean)).find(Boolean) || null;
"""
VIDEO = f"(() => {{ {FIND_STREAM} return stream.video; }})()"

# With these two, firefox-esr 153 offers H.264 to WebRTC without OpenH264: Firefox offers it when
# the OpenH264 plug-in is there, or when `media.webrtc.hw.h264.enabled` is on and the GPU
# blocklist finds WEBRTC_HW_ACCELERATION_H264 OK. Headless on a machine without a GPU the
# blocklist says BLOCKED_DEVICE (FEATURE_FAILURE_GLXTEST_FAILED); the second preference is the
# blocklist's own per-feature status (the cache of its downloaded entries), 1 being
# FEATURE_STATUS_OK. Either alone leaves the offer without H.264. The stream is then decoded by
# Firefox's FFmpeg decoder (`media.navigator.mediadatadecoder_h264_enabled`, on by default) in
# its RDD process, with the system's libavcodec (libavcodec59: a Recommends of firefox-esr).
H264_PREFS: dict[str, bool | int | str] = {
    "media.webrtc.hw.h264.enabled": True,
    "gfx.blacklist.webrtc.hw.acceleration.h264": 1,
}

# the video codecs (no rtx, red, ulpfec) of this browser's receiver capabilities and of the offer
# of a receive-only peer connection, as the SDK's own offer would list them before reordering
OFFERED_CODECS = """
const media = (name) => !/^(rtx|red|ulpfec)$/i.test(name);
const pc = new RTCPeerConnection();
pc.addTransceiver('video', { direction: 'recvonly' });
const offer = await pc.createOffer();
pc.close();
const names = offer.sdp.split('\\r\\n').map((line) => /^a=rtpmap:\\d+ ([^/]+)\\//.exec(line))
  .filter(Boolean).map((match) => match[1].toUpperCase());
return {
  receiver: [...new Set(RTCRtpReceiver.getCapabilities('video').codecs
    .map((c) => c.mimeType.replace(/^video\\//i, '').toUpperCase()))].filter(media),
  offer: [...new Set(names)].filter(media),
};
"""


# -- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    base = tmp_path_factory.mktemp("firefox-serve")
    with serve_process(
        "--resolution", f"{WIDTH}x{HEIGHT}", "--fps", "30", "--scene-dir", str(base / "scenes"),
        log_path=base / "serve.log",
    ) as url:  # fmt: skip
        yield url


@pytest.fixture(scope="module")
def firefox() -> Iterator[Firefox]:
    with launch_firefox(viewport=VIEWPORT) as browser:
        print(f"\nfirefox {browser.version}")
        yield browser


@pytest.fixture
def browser(firefox: Firefox, server_url: str) -> Iterator[Firefox]:
    """The module's Firefox, left on a blank page with every stream it opened closed and the
    worker's slots free again. The streams are closed from here, not by leaving the page:
    Firefox closes a page's WebSocket before its `pagehide`, where the pages end their
    session, so a session left that way holds its slot until the server's resume grace
    (15 s) runs out, and the next test would wait in the queue behind it."""
    yield firefox
    end_streams(firefox)
    firefox.navigate("about:blank")
    eventually(lambda: busy_slots(server_url) == 0, 10, what="the worker's slots to be free")


# -- helpers -----------------------------------------------------------------------------------


def busy_slots(server_url: str) -> int:
    """The worker slots that sessions hold, read from the registry (/api/workers; /healthz's
    figures are a cached copy, refreshed every few seconds)."""
    with urllib.request.urlopen(server_url + "/api/workers", timeout=5) as response:
        workers = json.loads(response.read())["workers"]
    return sum(int(w["slots"]) - int(w["free"]) for w in workers)


def stream_state(firefox: Firefox) -> str | None:
    return firefox.execute(f"{FIND_STREAM} return stream && stream.state;")  # type: ignore[no-any-return]


def open_stream(firefox: Firefox, url: str) -> None:
    """Load `url` and wait until its stream plays (the SDK's `streaming`: a first frame shown)."""
    firefox.navigate(url)
    try:
        streaming = lambda: stream_state(firefox) == "streaming"  # noqa: E731
        eventually(streaming, STREAMING_TIMEOUT_S, what="streaming")
    except AssertionError as error:
        raise AssertionError(f"{url}: {error}; the stream is {stream_state(firefox)!r}") from None


def stream_stats(firefox: Firefox) -> dict[str, Any]:
    return firefox.execute_async(f"{FIND_STREAM} return await stream.stats();")  # type: ignore[no-any-return]


def end_streams(firefox: Firefox) -> None:
    firefox.execute(f"{FIND_STREAM} if (stream) stream.close('test_done');")


def assert_plays(firefox: Firefox, codec: str) -> dict[str, Any]:
    """The page's stream shows frames, in `codec`; its figures, for the caller to print."""
    frames = firefox.presented_frames(VIDEO, FRAMES_WINDOW_MS)
    stats = stream_stats(firefox)
    summary = {key: stats.get(key) for key in ("codec", "fps", "width", "height", "framesDecoded")}
    print(f"{frames} frames shown in {FRAMES_WINDOW_MS} ms; {summary}")
    assert frames >= MIN_FRAMES, f"{frames} frames shown in {FRAMES_WINDOW_MS} ms: {summary}"
    assert stats["codec"] == codec, summary
    assert stats["width"] > 0 and stats["height"] > 0, summary
    return stats


def grab(firefox: Firefox) -> np.ndarray:
    return np.array(firefox.grab_video(VIDEO), dtype=np.int16).reshape(90, 160, 4)[..., :3]


def settled_grab(firefox: Firefox, seconds: float = 0.6) -> np.ndarray:
    firefox.wait(seconds * 1000)
    return grab(firefox)


def assert_drag_turns_the_camera(firefox: Firefox) -> None:
    """A real left-button drag across the middle of the stage orbits the camera: the picture and
    the worker's camera both change, where the picture was still without input."""
    before = settled_grab(firefox)
    assert before.std() > 10, "the picture is blank"
    again = settled_grab(firefox)
    assert np.abs(before - again).mean() < 2.0, "a still camera must give a still picture"
    yaw = firefox.evaluate("window.renderStream.command('getCamera')")["yaw"]
    box = firefox.evaluate("document.getElementById('stage').getBoundingClientRect().toJSON()")
    cx, cy = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    # the moves go on the unordered `moves` channel in Firefox too: count them there
    moves = firefox.execute(
        "const moves = window.renderStream.moves, send = moves.send.bind(moves);"
        "window.__moves = 0; moves.send = (data) => { window.__moves++; send(data); };"
        "return [moves.label, moves.ordered, moves.readyState];"
    )
    assert moves == ["moves", False, "open"], moves
    firefox.drag((cx, cy), [(cx + 20 * step, cy + 3 * step) for step in range(1, 13)])
    # (12 moves in a few ms: the page sends at most one every 4 ms, the deltas summed)
    assert firefox.evaluate("window.__moves") >= 3, "the drag's moves did not go on `moves`"
    orbited = settled_grab(firefox)
    turned = firefox.evaluate("window.renderStream.command('getCamera')")["yaw"]
    change = np.abs(before - orbited).mean()
    print(f"drag: yaw {yaw:.3f} → {turned:.3f}, mean pixel change {change:.1f}")
    assert abs(turned - yaw) > 0.3, "the drag did not turn the camera"
    assert change > 5.0, "the drag did not change the picture"


def panel_codec(firefox: Firefox) -> str:
    """The codec the designer page's stats panel names, once it names one (it fills in from
    the SDK's first `stats` event)."""
    read = "document.getElementById('stat-codec').textContent"
    return str(eventually(lambda: (codec := firefox.evaluate(read)) != "–" and codec, 5,
                          what="the stats panel"))  # fmt: skip


def example_pages() -> list[str]:
    """The pages the examples' index links to (each streams)."""
    index = (ROOT / "render_server" / "client" / "examples" / "index.html").read_text()
    return sorted(set(re.findall(r'<a href="([\w-]+\.html)"', index)))


# -- stock Firefox: VP8 ------------------------------------------------------------------------


def test_stock_firefox_offers_no_h264_so_the_sdk_asks_for_vp8(
    browser: Firefox, server_url: str
) -> None:
    """Why Firefox gets VP8: its offer has no H.264, so the SDK's ranking starts at VP8."""
    open_stream(browser, server_url + "/")
    codecs = browser.execute_async(OFFERED_CODECS)
    print(f"stock firefox {browser.version}: {codecs}")
    assert "H264" not in codecs["receiver"] and "H264" not in codecs["offer"], codecs
    assert "VP8" in codecs["offer"], codecs
    assert browser.evaluate("window.renderStream.codecs")[0] == "VP8"
    assert browser.evaluate("window.renderStream.session.codec") == "VP8"


def test_designer_plays_vp8_and_a_drag_turns_the_camera(
    browser: Firefox, server_url: str, output_dir: Path
) -> None:
    opened = time.monotonic()
    open_stream(browser, server_url + "/")
    print(f"page load to first frame: {time.monotonic() - opened:.2f}s")
    stats = assert_plays(browser, "VP8")
    assert (stats["width"], stats["height"]) == (WIDTH, HEIGHT)
    assert panel_codec(browser) == "VP8"
    assert browser.evaluate("document.getElementById('stat-resolution').textContent") == (
        f"{WIDTH}×{HEIGHT}"
    )
    assert_drag_turns_the_camera(browser)
    assert stream_state(browser) == "streaming"
    assert browser.presented_frames(VIDEO, FRAMES_WINDOW_MS) >= MIN_FRAMES, "stalled after input"
    (output_dir / "firefox-designer.png").write_bytes(
        browser.marionette.screenshot(format="binary")
    )


def test_the_pixel_meter_measures_first_moves_on_firefoxs_stream(
    browser: Firefox, server_url: str
) -> None:
    """The SDK's first-move meter works on Firefox's real stream: Firefox gives a WebRTC
    stream's frames mediaTime 0, which the meter took for a frame the element no longer held,
    refusing every sample once the stream had played a second (no first move was measured:
    all counted as `moving`)."""
    open_stream(browser, server_url + "/")
    box = browser.evaluate("document.getElementById('stage').getBoundingClientRect().toJSON()")
    cx, cy = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    browser.wait(1500)  # past the first second of the stream
    for n in range(4):
        browser.wait(900)  # still for longer than the meter's STILL_MS
        sign = 1 if n % 2 == 0 else -1
        browser.drag((cx, cy), [(cx + sign * 15 * step, cy) for step in range(1, 7)])
    browser.wait(1200)
    first = browser.evaluate("window.renderStream.latency().firstMove")
    print(f"first moves in Firefox: {first}")
    assert first["count"] >= 2, first
    assert 0 < first["p50"] < 500, first


def test_a_designers_model_opens_in_firefox(browser: Firefox, server_url: str) -> None:
    """The SDK's upload (XMLHttpRequest with progress) and loadScene in Firefox: the model
    replaces the scene in Firefox's VP8 stream; a file that is no model is refused by reason."""
    open_stream(browser, server_url + "/")
    assert magenta_share(grab(browser)) < 0.02
    run = """
      const [data, name] = arguments;
      const bytes = Uint8Array.from(atob(data), (c) => c.charCodeAt(0));
      const phases = new Set();
      try {
        const shown = await window.renderStream.loadScene(new File([bytes], name),
          { onProgress: ({ phase }) => phases.add(phase) });
        return { triangles: shown.triangles, phases: [...phases] };
      } catch (error) { return { code: error.code, message: error.message }; }
    """
    glb = base64.b64encode(magenta_ball_glb()).decode()
    shown = browser.execute_async(run, glb, "ball.glb", timeout_s=60)
    assert shown == {"triangles": 1280, "phases": ["upload", "loading"]}, shown
    eventually(lambda: magenta_share(grab(browser)) > 0.10, 10, what="the ball in the picture")
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 100).decode()
    refused = browser.execute_async(run, png, "photo.glb", timeout_s=30)
    assert refused["code"] == "not_a_model" and "PNG" in refused["message"], refused
    assert stream_state(browser) == "streaming"


def shared_link(owner: Any, server_url: str, codec: str) -> str:
    """A designer's page in Chromium streaming `codec`, shared: the viewer link."""
    owner.goto(f"{server_url}/?codec={codec}")
    owner.wait_for_selector("body[data-state='streaming']", state="attached", timeout=20_000)
    return str(owner.evaluate("window.renderStream.share().then((link) => link.url)"))


def test_a_reviewer_in_firefox_watches_a_shared_session(browser: Firefox, server_url: str) -> None:
    """A designer in Chromium shares a VP8 session; a reviewer opens the link in Firefox: the
    same stream plays, the page says who steers, the reviewer's input is refused, and the
    designer's Remove ends the reviewer's stream for good. The link to an H.264 session tells
    Firefox (which has no H.264 here) why it cannot play."""
    with chromium_page() as owner:
        open_stream(browser, shared_link(owner, server_url, "VP8"))
        assert_plays(browser, "VP8")
        status = "document.getElementById('presence-status').textContent"
        eventually(lambda: "host is steering" in browser.evaluate(status), 10, what="presence")
        refused = browser.execute_async(
            """const channel = window.renderStream.input;
               const reply = new Promise((resolve) => channel.addEventListener('message',
                 (e) => { const m = JSON.parse(e.data); if (m.type === 'error') resolve(m); }));
               channel.send(JSON.stringify({type: 'pointer', action: 'move', dx: 0.2,
                                            dy: 0, buttons: 1}));
               return await reply;""",
            timeout_s=10,
        )
        assert refused["code"] == "forbidden" and "host" in refused["message"], refused
        # the designer removes the reviewer: Firefox's page says so and stays out
        reviewer = browser.evaluate("window.renderStream.viewerId")
        owner.click(f"button.remove-viewer[data-peer='{reviewer}']")
        eventually(lambda: stream_state(browser) == "error", 10, what="the removal")
        said = browser.evaluate("document.getElementById('status').textContent")
        assert said == "The owner removed you from this session.", said
        browser.wait(1500)  # past the first reconnect's backoff
        assert stream_state(browser) == "error"
        end_streams(browser)
    # another link to "/" changes only the fragment: the page starts again with it
    with chromium_page() as owner:
        browser.navigate(shared_link(owner, server_url, "H264"))

        def refused() -> bool:
            # the page reloads on the new fragment: until then, the removed stream is still there
            reason = browser.execute(f"{FIND_STREAM} return stream && stream.reason;") or ""
            return stream_state(browser) == "error" and not reason.startswith("removed")

        eventually(
            refused, 20,
            what=lambda: f"the refusal; state {stream_state(browser)!r}: "
            + str(browser.execute(f"{FIND_STREAM} return [stream.reason, stream.session];")),
        )  # fmt: skip
        reason = browser.execute(f"{FIND_STREAM} return stream.reason;")
        assert reason.startswith("bad_offer") and "H264" in reason, reason


def test_embed_plays_on_its_own(browser: Firefox, server_url: str) -> None:
    """/embed opened as a page, not framed: it connects by itself and plays."""
    open_stream(browser, server_url + "/embed")
    assert browser.evaluate("document.body.dataset.state") == "streaming"
    assert_plays(browser, "VP8")


def test_examples_index_links_to_the_examples(browser: Firefox, server_url: str) -> None:
    browser.navigate(server_url + "/client/examples/")
    links = browser.execute("return Array.from(document.links, (a) => a.getAttribute('href'));")
    assert example_pages(), "the examples' index links to no page"
    assert sorted(links) == example_pages()


@pytest.mark.parametrize("page", example_pages())
def test_example_streams(browser: Firefox, server_url: str, page: str) -> None:
    """Each example, followed from the examples' index as a visitor would, reaches `streaming`
    and keeps showing frames (the iframe example's stream is in its same-origin /embed frame)."""
    browser.navigate(server_url + "/client/examples/")
    href = browser.execute(f"return document.querySelector('a[href=\"{page}\"]').href;")
    open_stream(browser, href)
    assert_plays(browser, "VP8")


# -- H.264 by preferences ----------------------------------------------------------------------


def test_h264_enabled_by_prefs_is_offered_and_picked(server_url: str, firefox: Firefox) -> None:
    """With H264_PREFS Firefox offers H.264, the SDK ranks it first, the worker sends it and the
    designer plays it (decoded by FFmpeg), and the mouse still steers. Its own Firefox: these
    preferences are read at startup. The module's Firefox is left idle on a blank page."""
    firefox.navigate("about:blank")
    with launch_firefox(viewport=VIEWPORT, prefs=H264_PREFS) as h264:
        open_stream(h264, server_url + "/")
        codecs = h264.execute_async(OFFERED_CODECS)
        print(f"firefox {h264.version} with {H264_PREFS}: {codecs}")
        assert "H264" in codecs["receiver"] and "H264" in codecs["offer"], codecs
        assert h264.evaluate("window.renderStream.codecs")[0] == "H264"
        stats = assert_plays(h264, "H264")
        assert (stats["width"], stats["height"]) == (WIDTH, HEIGHT)
        assert panel_codec(h264) == "H264"
        assert_drag_turns_the_camera(h264)
        end_streams(h264)


# -- leaving the page ------------------------------------------------------------------------


def test_leaving_the_page_ends_its_session_at_once(firefox: Firefox, server_url: str) -> None:
    """Leaving the designer page frees its worker slot at once, as it does in Chromium
    (session.end, `client_ended`). Firefox closes the page's WebSocket (1001) after
    beforeunload and before pagehide: the pages end the session on beforeunload too (before,
    the server ended it only when the resume grace, 15 s, ran out, and the next page queued
    behind it)."""
    open_stream(firefox, server_url + "/")
    assert busy_slots(server_url) == 1
    firefox.navigate("about:blank")
    eventually(lambda: busy_slots(server_url) == 0, 5, what="the slot to be freed")
