"""The SDK's clock alignment (client/latency.js, `LatencyMeter.onPong`) in headless Chromium
(Playwright) and Firefox (firefox-esr through Marionette): the same pongs give the same offset
and bound as the Python tools' `ClockOffset`, which tests/test_measure.py checks against the
truth."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

import pytest

from render_server.tools.measure.clock import ClockOffset
from tests.browser import ROOT, chromium_page, static_site
from tests.firefox import launch_firefox

PAGE = """<!doctype html><script type="module">
import * as latency from '/latency.js';
window.latency = latency;
</script>"""

# each case: pongs as [sent, worker, received], fed to a fresh meter; the answer after each
FEED = """(cases) => cases.map((pongs) => {
  const meter = new window.latency.LatencyMeter();
  const seen = [[meter.offset, meter.offsetErrorMs]];
  for (const [t, w, received] of pongs) {
    meter.onPong({ t, w }, received);
    seen.push([meter.offset, meter.offsetErrorMs]);
  }
  const s = meter.summary();
  seen.push([s.clockOffsetMs, s.clockErrorMs]);
  return seen;
})"""


def _python(pongs: list[tuple[float, float, float]]) -> list[tuple[Any, Any]]:
    clock = ClockOffset()
    seen: list[tuple[Any, Any]] = [(None, None)]
    for sent, worker, received in pongs:
        clock.add(sent, worker, received)
        seen.append((clock.offset, clock.error_bound))
    return seen + [seen[-1]]


def _random_pongs(rng: random.Random, count: int) -> list[tuple[float, float, float]]:
    """Round trips whose legs wait for busy loops; every tenth case's worker clock steps."""
    pongs, t, truth = [], 0.0, rng.uniform(-5e6, 5e6)
    step_at = rng.randrange(count) if rng.random() < 0.1 else None
    for i in range(count):
        t += rng.uniform(100.0, 1000.0)
        if i == step_at:
            truth += rng.uniform(-100.0, 100.0)
        ping_leg, pong_leg = rng.expovariate(1 / 5.0), rng.expovariate(1 / 3.0)
        pongs.append((t, t + ping_leg + truth, t + ping_leg + pong_leg))
    return pongs


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    module = (ROOT / "render_server" / "client" / "latency.js").read_text()
    files = {"index.html": PAGE, "latency.js": module}
    with static_site(tmp_path_factory.mktemp("clock"), files) as root:
        yield root


def _feed(browser: str, site: str, cases: list[Any]) -> Any:
    if browser == "chromium":
        with chromium_page() as page:
            page.goto(site)
            page.wait_for_function("window.latency !== undefined")
            return page.evaluate(FEED, cases)
    with launch_firefox() as firefox:
        firefox.navigate(site)
        return firefox.execute_async(
            "while (window.latency === undefined) await new Promise((r) => setTimeout(r, 10));"
            f"return ({FEED})(arguments[0]);",
            cases,
        )


@pytest.mark.parametrize("browser", ["chromium", "firefox"])
def test_the_sdk_aligns_the_clocks_as_the_python_tools_do(browser: str, site: str) -> None:
    rng = random.Random(7)
    cases = [
        [(0.0, 1001.0, 30.0), (100.0, 1127.0, 128.0)],  # the bounds meet: 1000 ± 1
        [(0.0, 1010.0, 30.0), (100.0, 1105.0, 104.0), (200.0, 1722.0, 226.0)],  # a step
    ] + [_random_pongs(rng, rng.randrange(1, 40)) for _ in range(60)]  # fmt: skip
    answers = _feed(browser, site, json.loads(json.dumps(cases)))
    assert answers[0][-1] == [1000.0, 1.0]
    assert answers[1][-1] == [1003.0, 2.0]  # the fastest round trip's middle
    for pongs, seen in zip(cases, answers, strict=True):
        expected = _python(pongs)
        assert len(seen) == len(expected)
        for (offset, bound), (want_offset, want_bound) in zip(seen, expected, strict=True):
            if want_offset is None:
                assert offset is None and bound is None
            else:
                assert offset == pytest.approx(want_offset, abs=1e-9)
                assert bound == pytest.approx(want_bound, abs=1e-9)
