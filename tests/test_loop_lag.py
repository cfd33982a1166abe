"""How late the event loop runs its timers, on /metrics and in the log (render_server/loop_lag.py);
a worker pool's child frozen for a while is in tests/test_worker_pool.py."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from render_server.loop_lag import INTERVAL_S, watch_event_loop
from render_server.metrics import Metrics


def _lag(metrics: Metrics) -> dict[str, float]:
    """count, sum, and each bucket's cumulative count by its bound."""
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        if family.name != "python_event_loop_lag_seconds":
            continue
        for s in family.samples:
            key = s.labels["le"] if s.name.endswith("_bucket") else s.name.rsplit("_", 1)[1]
            out[key] = s.value
    return out


def test_a_held_loop_shows_as_a_late_timer_and_a_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = Metrics()
    before = _lag(metrics)

    async def main() -> None:
        watch_event_loop()
        watch_event_loop()  # once per loop, however often asked
        await asyncio.sleep(0.5)
        time.sleep(0.3)  # a callback that holds the loop
        await asyncio.sleep(0.5)

    with caplog.at_level(logging.WARNING, logger="render_server.loop_lag"):
        asyncio.run(main())
    after = _lag(metrics)
    timers = after["count"] - before["count"]
    # ~1.3 s of timers every 50 ms (one chain: a second would double them); while held, none
    assert 1.3 / INTERVAL_S * 0.6 <= timers <= 1.3 / INTERVAL_S + 2, timers
    # the timer due while the loop was held ran 0.25–0.3 s late (a busy machine may add one)
    late = (after["count"] - after["0.2"]) - (before["count"] - before["0.2"])
    assert late >= 1
    assert after["sum"] - before["sum"] >= 0.25
    stalls = [vars(r)["late_ms"] for r in caplog.records if r.getMessage() == "loop.stalled"]
    assert any(240 <= ms <= 450 for ms in stalls), stalls
    assert _lag(Metrics())["count"] == after["count"], "one process, one clock: every registry"


def test_the_watch_ends_with_its_loop() -> None:
    async def main() -> None:
        watch_event_loop()
        await asyncio.sleep(0.2)

    metrics = Metrics()
    asyncio.run(main())
    ended = _lag(metrics)["count"]
    time.sleep(0.2)
    assert _lag(metrics)["count"] == ended
