"""The designer page and the SDK in real headless Chromium: controls, stats, quality, pointer
lock, touch, reconnection with a frozen frame, and embedding from another origin."""

from __future__ import annotations

import io
import math
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from render_server.config import Resolution, ServerConfig, StreamConfig
from render_server.render.scene import Scene

from .browser import chromium_browser, free_port, serve_process
from .threaded_server import ThreadedServer, threaded_server

pytestmark = pytest.mark.browser

CLIENT = Path(__file__).parent.parent / "render_server" / "client"
VIEWPORT = {"width": 960, "height": 540}
STREAMING = "body[data-state='streaming']"


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    with chromium_browser() as browser:
        yield browser


def new_page(chromium: Any, **context_options: Any) -> Any:
    context = chromium.new_context(viewport=VIEWPORT, **context_options)
    page = context.new_page()
    page.on("console", lambda m: print(f"[chromium {m.type}] {m.text}"))
    page.on("pageerror", lambda e: print(f"[chromium pageerror] {e}"))
    return page


def camera(page: Any, stream: str = "window.renderStream") -> dict[str, Any]:
    return page.evaluate(f"{stream}.command('getCamera')")  # type: ignore[no-any-return]


def decoded_size(page: Any) -> tuple[int, int]:
    stats = page.evaluate("window.renderStream.stats()")
    return (stats["width"], stats["height"]) if stats else (0, 0)


def wait_until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


# -- the designer page -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def designer_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("designer") / "serve.log"
    with serve_process("--resolution", "960x540", "--fps", "30", log_path=log) as url:
        yield url


@pytest.fixture
def designer(chromium: Any, designer_url: str) -> Iterator[Any]:
    page = new_page(chromium, has_touch=True)
    page.goto(designer_url + "/")
    page.wait_for_selector(STREAMING, state="attached", timeout=20_000)
    yield page
    page.context.close()


def test_stats_panel_shows_live_figures_and_hides(designer: Any, output_dir: Path) -> None:
    for cell in ("fps", "bitrate", "loss", "jitter", "buffer", "decode", "rtt"):
        designer.wait_for_function(
            f"() => !/^(–|0 kbps)/.test(document.getElementById('stat-{cell}').textContent)",
            timeout=8_000,
        )
    figures = {
        cell: designer.text_content(f"#stat-{cell}")
        for cell in ("fps", "bitrate", "resolution", "codec", "loss", "jitter", "buffer", "decode")
    }
    print(f"stats panel: {figures}")
    assert float(figures["fps"] or 0) > 10
    assert figures["resolution"] == "960×540"
    assert re.fullmatch(r"\d+\.\d\d % \(\d+\)", figures["loss"] or ""), figures["loss"]
    assert re.fullmatch(r"\d+\.\d ms", figures["decode"] or ""), figures["decode"]
    designer.screenshot(path=str(output_dir / "designer-stats.png"))
    designer.click("#toggle-stats")
    assert designer.is_hidden("#overlay")
    designer.click("#toggle-stats")
    assert designer.is_visible("#overlay")


# counts what the page sends on each of its channels, by type (`pointer:move` for moves)
COUNT_SENDS_JS = """() => {
  window.__sent = { input: {}, moves: {} };
  for (const name of ['input', 'moves']) {
    const channel = window.renderStream[name], send = channel.send.bind(channel);
    channel.send = (data) => {
      const m = JSON.parse(data), key = m.type === 'pointer' ? `pointer:${m.action}` : m.type;
      window.__sent[name][key] = (window.__sent[name][key] || 0) + 1;
      send(data);
    };
  }
}"""


def test_hover_mode_drag_orbits_and_plain_moves_do_not(designer: Any) -> None:
    box = designer.locator("#stage").bounding_box()
    cx, cy = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    moves = designer.evaluate(
        "(({label, ordered, readyState}) => ({label, ordered, readyState}))"
        "(window.renderStream.moves)"
    )
    assert moves == {"label": "moves", "ordered": False, "readyState": "open"}
    designer.evaluate(COUNT_SENDS_JS)
    before = camera(designer)
    designer.mouse.move(cx, cy)
    designer.mouse.move(cx + 120, cy + 20, steps=6)  # hovering: no button, no orbit
    designer.wait_for_timeout(200)
    assert camera(designer)["yaw"] == pytest.approx(before["yaw"])
    designer.mouse.down()
    designer.mouse.move(cx + 320, cy + 20, steps=10)
    designer.mouse.up()
    designer.wait_for_timeout(200)
    after = camera(designer)
    print(f"hover drag: yaw {before['yaw']:.3f} → {after['yaw']:.3f}")
    assert abs(after["yaw"] - before["yaw"]) > 0.3
    # the drag's moves went on the unordered channel (and steered: the orbit above); presses
    # and everything else on the ordered one
    sent = designer.evaluate("window.__sent")
    print(f"sent by channel: {sent}")
    # (10 steps in a few ms: coalesced into fewer messages, `test_a_fast_mouse_...` below)
    assert sent["moves"].get("pointer:move", 0) >= 2 and set(sent["moves"]) == {"pointer:move"}
    assert "pointer:move" not in sent["input"] and sent["input"].get("pointer:down") == 1


def metric_value(url: str, line_start: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(line_start))


# a 1000 Hz mouse held down: raw pointer updates on the stage, 4 every 4 ms (as the browser
# hands them over in tasks), movementX in a pattern whose net is a fifth of a pixel per update
# (Chromium's CDP mouse waits for a frame per move: 60 a second, too slow to show this)
FAST_MOUSE_JS = """async ([count, x, y]) => {
  const stage = document.getElementById('stage');
  const type = 'onpointerrawupdate' in window ? 'pointerrawupdate' : 'pointermove';
  const pattern = [1, -1, 1, -1, 1];
  let sent = 0;
  const started = performance.now();
  await new Promise((done) => {
    const timer = setInterval(() => {
      for (let i = 0; i < 4 && sent < count; i++, sent++) {
        stage.dispatchEvent(new PointerEvent(type, {
          pointerType: 'mouse', pointerId: 1, isPrimary: true, buttons: 1, bubbles: true,
          clientX: x, clientY: y, movementX: pattern[sent % pattern.length], movementY: 0,
        }));
      }
      if (sent >= count) { clearInterval(timer); done(); }
    }, 4);
  });
  return { count: sent, ms: performance.now() - started,
           net: [...Array(count).keys()].reduce((a, i) => a + pattern[i % pattern.length], 0) };
}"""


def test_a_fast_mouse_is_coalesced_not_refused_and_the_drag_keeps_its_length(
    designer: Any, designer_url: str
) -> None:
    """Pointer updates far faster than the worker's 500 messages a second (a 1000 Hz mouse,
    for 1.5 s: the worker's burst of 200 would not cover it): the page sends at most one move
    a 4 ms with the deltas summed, so none is refused and the camera turns exactly as far as
    the drag went (a drag across the height turns it 180 degrees)."""
    box = designer.locator("#stage").bounding_box()
    cx, cy, height = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2, box["height"]
    designer.evaluate(COUNT_SENDS_JS)
    refused = 'worker_input_rejected_total{code="rate_limited"}'
    refused_before = metric_value(designer_url, refused)
    designer.mouse.move(cx, cy)
    designer.mouse.down()
    designer.wait_for_timeout(100)
    before = camera(designer)
    fast = designer.evaluate(FAST_MOUSE_JS, [1500, cx, cy])
    designer.mouse.up()
    designer.wait_for_timeout(300)
    after = camera(designer)
    sent = designer.evaluate("window.__sent")["moves"].get("pointer:move", 0)
    turned = math.remainder(after["yaw"] - before["yaw"], 2 * math.pi)
    expected = math.pi * fast["net"] / height
    print(f"{fast['count']} raw updates in {fast['ms']:.0f} ms "
          f"({fast['count'] / fast['ms'] * 1000:.0f}/s), {sent} move messages; turned "
          f"{math.degrees(turned):.2f} degrees of {math.degrees(expected):.2f}")  # fmt: skip
    assert fast["count"] / fast["ms"] * 1000 > 700  # faster than the worker takes
    assert sent <= fast["ms"] / 4 + 3  # one move a 4 ms at most
    assert metric_value(designer_url, refused) == refused_before  # none refused
    assert abs(turned) == pytest.approx(expected, rel=0.01)  # the whole drag, summed


def test_pointer_lock_looks_around_without_buttons_and_esc_releases(
    designer: Any, output_dir: Path
) -> None:
    designer.click("#lock")
    designer.wait_for_function("() => document.pointerLockElement?.id === 'stage'", timeout=5_000)
    # the page marks it from the pointerlockchange event, which comes after pointerLockElement
    # is set (a task later: under load, after the line above returns)
    designer.wait_for_function("() => document.body.classList.contains('locked')", timeout=5_000)
    before = camera(designer)
    designer.mouse.move(400, 300)
    designer.mouse.move(520, 260, steps=8)  # no button held
    designer.wait_for_timeout(250)
    after = camera(designer)
    print(f"pointer-locked move: yaw {before['yaw']:.3f} → {after['yaw']:.3f}, "
          f"pitch {before['pitch']:.3f} → {after['pitch']:.3f}")  # fmt: skip
    assert abs(after["yaw"] - before["yaw"]) > 0.2
    designer.screenshot(path=str(output_dir / "designer-pointer-locked.png"))
    designer.keyboard.press("Escape")
    designer.wait_for_function("() => document.pointerLockElement === null", timeout=5_000)
    designer.wait_for_function(
        "() => document.getElementById('lock').textContent === 'Capture mouse'", timeout=5_000
    )


def test_touch_pinch_zooms_in(designer: Any) -> None:
    cdp = designer.context.new_cdp_session(designer)
    box = designer.locator("#stage").bounding_box()
    cx, cy = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2

    def touch(kind: str, spread: float) -> None:
        points = [] if kind == "touchEnd" else [
            {"x": cx - spread, "y": cy, "id": 0}, {"x": cx + spread, "y": cy, "id": 1},
        ]  # fmt: skip
        cdp.send("Input.dispatchTouchEvent", {"type": kind, "touchPoints": points})

    before = camera(designer)
    touch("touchStart", 40)
    for step in range(1, 11):
        touch("touchMove", 40 + 16 * step)  # fingers apart: closer
        designer.wait_for_timeout(20)
    touch("touchEnd", 0)
    designer.wait_for_timeout(250)
    after = camera(designer)
    print(f"pinch: distance {before['distance']:.3f} → {after['distance']:.3f}")
    assert after["distance"] < before["distance"] * 0.6


def test_match_my_window_follows_resize(designer: Any, output_dir: Path) -> None:
    designer.select_option("#quality", "window")
    wait_until(lambda: decoded_size(designer) == (960, 540), 10, "960×540 at the window size")
    designer.set_viewport_size({"width": 640, "height": 400})
    wait_until(lambda: decoded_size(designer) == (640, 400), 15, "the frame to follow to 640×400")
    applied = designer.evaluate("window.renderStream.quality")
    assert (applied["width"], applied["height"]) == (640, 400)
    designer.wait_for_function(
        "() => document.getElementById('stat-resolution').textContent === '640×400'", timeout=5_000
    )
    designer.screenshot(path=str(output_dir / "designer-resized.png"))
    # the window moves to a denser screen: same CSS size, 1.5 device pixels per CSS pixel
    cdp = designer.context.new_cdp_session(designer)
    cdp.send(
        "Emulation.setDeviceMetricsOverride",
        {"width": 640, "height": 400, "deviceScaleFactor": 1.5, "mobile": False},
    )
    wait_until(lambda: decoded_size(designer) == (960, 600), 15, "960×600 at 1.5 dppx")
    cdp.send("Emulation.clearDeviceMetricsOverride")
    designer.select_option("#quality", "1280x720")
    wait_until(lambda: decoded_size(designer) == (1280, 720), 15, "a fixed 1280×720")
    designer.select_option("#bitrate", "1000")
    designer.wait_for_function("() => window.renderStream.quality.maxKbps === 1000", timeout=5_000)


def test_scene_commands_and_their_errors(designer: Any) -> None:
    scene = designer.evaluate("window.renderStream.command('listScene')")
    names = {o["name"] for o in scene["objects"]}
    assert {"red_sphere", "blue_box"} <= names
    designer.evaluate(
        "window.renderStream.command('setVisible', {object: 'blue_box', visible: false})"
    )
    scene = designer.evaluate("window.renderStream.command('listScene')")
    assert not next(o for o in scene["objects"] if o["name"] == "blue_box")["visible"]
    error = designer.evaluate(
        "window.renderStream.command('launchRockets', {}).then(() => null, e => "
        "({code: e.code, message: e.message}))"
    )
    assert error["code"] == "unknown_command", error
    assert "setMaterial" in error["message"]
    assert designer.evaluate("window.renderStream.state") == "streaming"


# -- reconnection ------------------------------------------------------------------------------


@pytest.fixture
def live_server(scene: Scene) -> Iterator[ThreadedServer]:
    config = ServerConfig(port=0, stream=StreamConfig(resolution=Resolution(640, 360)), slots=2)
    with threaded_server(config, scene) as server:
        yield server


def stage_luminance(page: Any) -> float:
    png = page.screenshot(clip={"x": 0, "y": 0, **VIEWPORT})
    return float(np.asarray(Image.open(io.BytesIO(png)).convert("L"), dtype=np.float32).mean())


def watch_reconnect(page: Any, timeout: float) -> list[float]:
    """Luminance of the stage, sampled until the stream has reconnected; the state must have
    passed through `reconnecting`."""
    samples = []
    deadline = time.monotonic() + timeout
    while True:
        samples.append(stage_luminance(page))
        states = page.evaluate("window.states")
        if "reconnecting" in states and states[-1] == "streaming":
            return samples
        if time.monotonic() > deadline:
            raise AssertionError(f"no reconnection in {timeout}s: states {states}")


def test_worker_peer_loss_and_signaling_loss_reconnect_without_going_black(
    chromium: Any, live_server: ThreadedServer, output_dir: Path
) -> None:
    page = new_page(chromium)
    page.goto(live_server.url + "/")
    page.wait_for_selector(STREAMING, state="attached", timeout=20_000)
    page.wait_for_timeout(500)
    page.evaluate(
        "window.states = []; window.renderStream.addEventListener('state', "
        "e => window.states.push(e.detail.state))"
    )
    streaming_level = stage_luminance(page)
    print(f"stage luminance while streaming: {streaming_level:.1f}")
    assert streaming_level > 30

    # 1. the worker's end of the media goes away
    (session,) = live_server.sessions()
    first_pc = session.pc
    assert first_pc is not None
    live_server.call(first_pc.close)
    samples = watch_reconnect(page, 25)
    page.screenshot(path=str(output_dir / "reconnected-after-peer-loss.png"))
    print(f"peer loss: {len(samples)} samples, darkest {min(samples):.1f}")
    assert min(samples) > streaming_level * 0.5, "the picture went dark while reconnecting"
    assert session.pc is not None and session.pc is not first_pc, "no new peer connection"
    assert live_server.sessions() == [session], "the same session carries on"
    frames = page.evaluate("window.renderStream.stats()")["framesDecoded"]
    page.wait_for_timeout(1000)
    assert page.evaluate("window.renderStream.stats()")["framesDecoded"] > frames + 10

    # 2. the signaling socket drops (a replica restarts): resume, and the media never stops
    page.evaluate("window.states = []; window.pcBefore = window.renderStream.pc")
    sockets = live_server.browser_sockets()
    assert len(sockets) == 1
    live_server.call(lambda: sockets[0].close(code=1012, message=b"service restart"))
    samples = watch_reconnect(page, 25)
    print(f"signaling loss: states {page.evaluate('window.states')}, darkest {min(samples):.1f}")
    assert min(samples) > streaming_level * 0.5
    assert page.evaluate("window.renderStream.pc === window.pcBefore"), "media was renegotiated"
    wait_until(lambda: len(live_server.browser_sockets()) == 1, 5, "one resumed socket")
    assert camera(page)["distance"] > 0  # the data channel still answers
    page.context.close()


# -- embedding from another origin -------------------------------------------------------------

ROGUE_PAGE = """<!doctype html><meta charset="utf-8"><title>rogue</title><script>
// a frame from an origin the server does not allow tries to drive its sibling embed
window.addEventListener('load', () => {
  for (const message of [
    {renderStream: 1, type: 'command', id: 99, name: 'setTimeOfDay', args: {hours: 3}},
    {renderStream: 1, type: 'close'},
  ]) parent.frames[0].postMessage(message, '*');
  document.title = 'sent';
});
</script>"""


@pytest.fixture(scope="module")
def host_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A web app on another origin: the examples plus a rogue page, served by a plain server."""
    root = tmp_path_factory.mktemp("host-site")
    for item in (CLIENT / "examples").iterdir():
        shutil.copy(item, root / item.name)
    (root / "rogue.html").write_text(ROGUE_PAGE)
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
         "--directory", str(root)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_until(lambda: _port_open(port), 10, "the host site")
        yield port
    finally:
        process.terminate()
        process.wait(10)


def _port_open(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def embed_server(tmp_path_factory: pytest.TempPathFactory, host_site: int) -> Iterator[str]:
    log = tmp_path_factory.mktemp("embed") / "serve.log"
    with serve_process(
        "--resolution", "640x360", "--allow-origin", f"http://127.0.0.1:{host_site}",
        log_path=log,
    ) as url:  # fmt: skip
        yield url


def test_custom_element_streams_on_another_origin(
    chromium: Any, embed_server: str, host_site: int, output_dir: Path
) -> None:
    page = new_page(chromium)
    page.goto(f"http://127.0.0.1:{host_site}/element.html?server={embed_server}")
    page.wait_for_function(
        "() => window.renderElement?.dataset.state === 'streaming'", timeout=20_000
    )
    stats = page.evaluate("window.renderElement.stream.stats()")
    assert stats["width"] > 0 and stats["codec"] == "H264"
    page.click("text=Hide the box")
    page.wait_for_function("() => window.lastResult !== null", timeout=5_000)
    scene = page.evaluate("window.renderElement.stream.command('listScene')")
    assert not next(o for o in scene["objects"] if o["name"] == "blue_box")["visible"]
    page.click("text=Evening light")
    page.wait_for_timeout(800)
    page.screenshot(path=str(output_dir / "embed-element-cross-origin.png"))
    page.context.close()


def test_iframe_embed_streams_and_ignores_messages_from_other_origins(
    chromium: Any, embed_server: str, host_site: int, output_dir: Path
) -> None:
    page = new_page(chromium)
    page.goto(f"http://127.0.0.1:{host_site}/iframe.html?server={embed_server}")
    page.wait_for_function("() => (window.embedMessages || []).includes('stats')", timeout=20_000)
    reply = page.evaluate("window.embedCommand('getCamera')")
    assert reply["type"] == "result" and math.isfinite(reply["value"]["yaw"]), reply
    hours = page.evaluate("window.embedCommand('listScene')")["value"]["timeOfDay"]
    page.screenshot(path=str(output_dir / "embed-iframe-cross-origin.png"))

    # a sibling frame from an origin the server does not allow: ignored, and counted
    page.evaluate(
        f"""() => new Promise((resolve) => {{
          const rogue = document.createElement('iframe');
          rogue.src = 'http://localhost:{host_site}/rogue.html';
          rogue.onload = () => setTimeout(resolve, 500);
          document.body.append(rogue);
        }})"""
    )
    embed = next(f for f in page.frames if f.url.startswith(embed_server + "/embed"))
    assert embed.evaluate("window.renderEmbed.ignoredMessages") >= 2
    assert embed.evaluate("window.renderStream.state") == "streaming"
    assert page.evaluate("window.embedCommand('listScene')")["value"]["timeOfDay"] == hours
    page.context.close()


def test_embed_refuses_to_be_framed_by_an_origin_not_allowed(
    chromium: Any, embed_server: str, host_site: int
) -> None:
    page = new_page(chromium)
    # localhost is another origin than 127.0.0.1: not in the allow-list
    page.goto(f"http://localhost:{host_site}/iframe.html?server={embed_server}")
    page.wait_for_timeout(3000)
    assert page.evaluate("window.embedMessages") == []
    assert not any(
        f.url.startswith(embed_server + "/embed")
        and f.evaluate("() => Boolean(window.renderEmbed)")
        for f in page.frames
        if f != page.main_frame
    )
    page.context.close()


# -- the SDK's types -------------------------------------------------------------------------


def declared_exports(dts: Path) -> set[str]:
    return set(re.findall(r"^export declare (?:const|class|function) (\w+)", dts.read_text(), re.M))


CLASS_BODY = r"^export declare class {}\b[^{{]*\{{(.*?)^\}}"
METHOD = re.compile(r"^  (?:static )?(?!constructor)(\w+)(?:<[^>]*>)?\(", re.M)


def declared_members(dts: Path, cls: str) -> set[str]:
    body = re.search(CLASS_BODY.format(cls), dts.read_text(), re.M | re.S)
    assert body, f"{cls} is not declared in {dts.name}"
    return set(METHOD.findall(body.group(1)))


def test_type_declarations_match_the_modules(chromium: Any, designer_url: str) -> None:
    page = new_page(chromium)
    page.goto(designer_url + "/client/examples/index.html")
    for module, dts in (
        ("render-stream.js", CLIENT / "render-stream.d.ts"),
        ("render-stream-element.js", CLIENT / "render-stream-element.d.ts"),
    ):
        exported = set(page.evaluate(f"import('/client/{module}').then(m => Object.keys(m))"))
        assert exported == declared_exports(dts), f"{module} and {dts.name} disagree"
    methods = set(
        page.evaluate("""import('/client/render-stream.js').then(({RenderStream: R}) => [
        ...Object.getOwnPropertyNames(R.prototype),
        ...Object.getOwnPropertyNames(R).filter(n => typeof R[n] === 'function'),
      ].filter(n => !n.startsWith('_') && n !== 'constructor'))""")
    )
    declared = declared_members(CLIENT / "render-stream.d.ts", "RenderStream") - {
        "addEventListener"  # EventTarget's, typed for the events
    }
    assert methods == declared, f"methods {sorted(methods)} but declared {sorted(declared)}"
    page.context.close()


def test_a_refused_start_is_one_error_event(chromium: Any, designer_url: str) -> None:
    """The server refuses the session (malformed requirements): the stream fails, and its
    listeners hear of it once, not once from the message and again from the failure."""
    page = new_page(chromium)
    page.goto(designer_url + "/client/examples/index.html")
    outcome = page.evaluate("""async () => {
      const { RenderStream } = await import('/client/render-stream.js');
      const box = document.createElement('div');
      document.body.append(box);
      const stream = new RenderStream(box, { requirements: { labels: ['not a label!'] } });
      const errors = [];
      stream.addEventListener('error', ({ detail }) => errors.push(detail.code));
      const failed = await stream.start().then(() => null, (e) => e.code);
      await new Promise((resolve) => setTimeout(resolve, 300));  // anything dispatched late
      return { failed, errors, state: stream.state };
    }""")
    assert outcome == {"failed": "bad_message", "errors": ["bad_message"], "state": "error"}
    page.context.close()
