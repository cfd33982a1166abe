"""The SDK's pixel meter (client/first-move.js) in real browsers, headless Chromium (Playwright)
and Firefox (Debian's firefox-esr through Marionette, tests/firefox.py), on a page whose picture
changes a known delay N after the input: a canvas streamed into a video element (`captureStream`),
no server. The page's own path from canvas to glass takes a few vsyncs of its own, which the meter
rightly counts; measured with N = 0 in the same page, it is subtracted, and the meter must then
report N within one frame interval; never less than N (but for the browser's frame clock);
and nothing for moves that change nothing, or that come while the picture changes by itself."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from tests.browser import CHROMIUM_ARGS, ROOT, chromium_path, static_site
from tests.firefox import launch_firefox

VIEWPORT = (640, 360)  # the video element's size
FRAME_INTERVAL_MS = 1000 / 30  # the designer page's default stream
ROUNDS = 8
# expectedDisplayTime is the browser's estimate of the next refresh, which in headless
# Chromium may run up to a refresh behind a paint made in the same frame
CLOCK_SLACK_MS = 1000 / 60

PAGE = """<!doctype html><html><body style="margin:0">
<video id="v" muted autoplay playsinline style="width:640px;height:360px"></video>
<script type="module">
import { FirstMoveMeter } from '/first-move.js';
const canvas = document.createElement('canvas');
canvas.width = 320; canvas.height = 180;
const g = canvas.getContext('2d');
let shade = 0;
function paint() { g.fillStyle = `rgb(${shade},${255 - shade},90)`; g.fillRect(0, 0, 320, 180); }
paint();
// keep frames coming while still, as a stream repeating a still picture does; or, with
// `window.animate`, change the picture by itself, as an animated scene does
window.animate = false;
setInterval(() => {
  if (window.animate) { shade = (shade + 37) % 256; paint(); } else g.fillRect(0, 0, 1, 1);
}, 66);
const video = document.getElementById('v');
video.srcObject = canvas.captureStream();
const meter = new FirstMoveMeter(video, { stillMs: 300, timeoutMs: 800 });
const onShown = (now, meta) => {
  meter.onFrameShown(now, meta);
  video.requestVideoFrameCallback(onShown);
};
video.requestVideoFrameCallback(onShown);
window.delayMs = 0;
window.changes = true;
window.meter = meter;
document.addEventListener('pointermove', (e) => {
  const message = { type: 'pointer', action: 'move', buttons: e.buttons, dx: 0.01, dy: 0 };
  meter.onSteer(message, e.timeStamp);
  if (!window.changes || !e.buttons) return;
  const wanted = window.delayMs;
  setTimeout(() => { shade = (shade + 97) % 256; paint(); }, wanted);
});
window.ready = new Promise((resolve) => video.addEventListener('playing', resolve, { once: true }));
</script></body></html>"""


@pytest.fixture(scope="module")
def page_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    client = ROOT / "render_server" / "client"
    files = {"index.html": PAGE}
    for module in ("first-move.js", "latency.js"):  # the meter and what it imports
        files[module] = (client / module).read_text()
    with static_site(tmp_path_factory.mktemp("meter"), files) as root:
        yield root + "index.html"


class _Chromium:
    """Playwright's page, with the calls the tests make of either browser (tests/firefox.py's
    Firefox has the same)."""

    name = "chromium"

    def __init__(self, page: Any, version: str) -> None:
        self.page = page
        self.version = version

    def evaluate(self, expression: str) -> Any:
        return self.page.evaluate(expression)

    def wait(self, ms: float) -> None:
        self.page.wait_for_timeout(ms)

    def drag(self, start: tuple[float, float], path: list[tuple[float, float]]) -> None:
        mouse = self.page.mouse
        mouse.move(*start)
        mouse.down()
        for x, y in path:
            mouse.move(x, y)
        mouse.up()


@contextlib.contextmanager
def _chromium(url: str) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=chromium_path(), headless=True, args=CHROMIUM_ARGS
        )
        width, height = VIEWPORT
        page = browser.new_page(viewport={"width": width, "height": height})
        page.goto(url)
        yield _Chromium(page, browser.version)
        browser.close()


@contextlib.contextmanager
def _firefox(url: str) -> Iterator[Any]:
    with launch_firefox(viewport=VIEWPORT) as firefox:
        firefox.navigate(url)
        yield firefox


@pytest.fixture(scope="module", params=["chromium", "firefox"])
def page(request: pytest.FixtureRequest, page_url: str) -> Iterator[Any]:
    """The page, playing, in one browser: `evaluate`, `wait` and `drag` on it."""
    with (_chromium if request.param == "chromium" else _firefox)(page_url) as browser:
        # the page needs the first two; without VideoFrame the meter draws the video to a canvas
        features = browser.evaluate(
            "({requestVideoFrameCallback: typeof HTMLVideoElement.prototype"
            ".requestVideoFrameCallback, captureStream: typeof HTMLCanvasElement.prototype"
            ".captureStream, VideoFrame: typeof VideoFrame})"
        )
        print(f"\n{request.param} {browser.version}: {features}")
        assert features["requestVideoFrameCallback"] == "function", features
        assert features["captureStream"] == "function", features
        browser.evaluate("window.ready")
        yield browser


def first_moves(
    page: Any, delay_ms: float, rounds: int = ROUNDS, changes: bool = True, settle_ms: float = 250
) -> dict[str, Any]:
    """`rounds` drags, each after stillness, on a page that changes `delay_ms` after input;
    each waits `settle_ms` after the change."""
    page.evaluate(
        f"window.meter.reset(), window.delayMs = {delay_ms}, "
        f"window.changes = {str(changes).lower()}"
    )
    for _ in range(rounds):
        page.wait(450)  # stillness: no input for more than stillMs
        # press at (300, 180), then four moves of 10 px (the first arms the meter), release
        page.drag((300, 180), [(310, 180), (320, 180), (330, 180), (340, 180)])
        page.wait(delay_ms + settle_ms)
    summary: dict[str, Any] = page.evaluate("window.meter.summary()")
    samples: list[float] = page.evaluate("window.meter.samples")
    summary["samples"] = samples
    return summary


@pytest.fixture(scope="module")
def display_path_ms(page: Any) -> float:
    """The page's own canvas → capture → video → glass time: the meter's figure for N = 0,
    once the first drags are over. Chromium shows the first one to eight first moves after the
    page's first input ~30 ms later (samples of ~40 ms, then ~10 ms: p50 of a first round 9 to
    45 ms in repeated runs, every later round 7 to 13 ms; waiting without input changes
    nothing), which taken as the reference would put every delay ~30 ms short. So a round of
    drags goes first, its figures only printed."""
    warm_up = first_moves(page, 0)
    print(f"{page.name}: first drags on the page: {warm_up}")
    summary = first_moves(page, 0)
    assert summary["count"] == ROUNDS, summary
    assert summary["p50"] < 4 * FRAME_INTERVAL_MS, summary  # a few vsyncs, not a stuck meter
    print(f"{page.name}: the page's own display path: {summary}")
    return float(summary["p50"])


@pytest.mark.parametrize("delay_ms", [60, 150])
def test_reports_the_delay_within_one_frame_interval(
    page: Any, display_path_ms: float, delay_ms: float
) -> None:
    summary = first_moves(page, delay_ms)
    samples = summary["samples"]
    assert summary["count"] == ROUNDS, summary  # one sample per first move, none for the others
    # never before the picture changed, but for the browser's frame clock
    assert min(samples) >= delay_ms - CLOCK_SLACK_MS, summary
    reported = summary["p50"] - display_path_ms
    print(f"{page.name}: delay {delay_ms} ms: the meter reports {reported:.1f} ms above the path")
    assert abs(reported - delay_ms) <= FRAME_INTERVAL_MS, (reported, summary)


def test_a_move_that_changes_nothing_gives_no_sample(page: Any) -> None:
    summary = first_moves(page, 0, rounds=3, changes=False, settle_ms=900)  # past the timeout
    assert summary["count"] == 0, summary
    assert summary["unchanged"] == 3, summary


def test_a_move_on_a_picture_that_changes_by_itself_is_not_measured(page: Any) -> None:
    page.evaluate("window.animate = true")
    try:
        summary = first_moves(page, 0, rounds=3, changes=False)
    finally:
        page.evaluate("window.animate = false")
    assert summary["count"] == 0, summary
    assert summary["moving"] == 3 and summary["unchanged"] == 0, summary
