"""The garbage collector's pauses and frozen objects on /metrics (render_server/gc_pauses.py)."""

from __future__ import annotations

import gc

import pytest
from prometheus_client.parser import text_string_to_metric_families

from render_server.memory import settle_heap
from render_server.metrics import Metrics


def _samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_a_full_collection_is_counted_and_timed_in_every_registry() -> None:
    first, second = Metrics(), Metrics()
    count = ("python_gc_pause_seconds_count", (("generation", "2"),))
    total = ("python_gc_pause_seconds_sum", (("generation", "2"),))
    gc.disable()  # no collection of its own between the two readings: only the one asked for
    try:
        before = _samples(first)
        garbage: list[object] = []
        garbage.append(garbage)  # a cycle: only a collection frees it
        del garbage
        gc.collect()
        after, other = _samples(first), _samples(second)
    finally:
        gc.enable()
    assert after[count] == before[count] + 1
    assert after[total] > before[total]
    assert other[count] == after[count], "one process, one clock: both registries say the same"
    inf = ("python_gc_pause_seconds_bucket", (("generation", "2"), ("le", "+Inf")))
    assert after[inf] == after[count]
    hooks = [c for c in gc.callbacks if type(c).__name__ == "_PauseClock"]
    assert len(hooks) == 1, "each registry added a hook of its own"


def test_frozen_objects_are_what_the_collector_leaves_out() -> None:
    frozen = ("python_gc_frozen_objects", ())
    try:
        settle_heap()
        assert _samples(Metrics())[frozen] == gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_a_scrape_does_not_count_the_frozen_objects(monkeypatch: pytest.MonkeyPatch) -> None:
    """Counting walks every frozen object (~20 ms in a pool child, on its event loop, each
    second): a scrape reads the count settle_heap took."""
    try:
        settle_heap()
        counted = gc.get_freeze_count()

        def walk() -> int:
            raise AssertionError("a scrape walked the frozen objects")

        monkeypatch.setattr(gc, "get_freeze_count", walk)
        assert _samples(Metrics())[("python_gc_frozen_objects", ())] == counted
    finally:
        gc.unfreeze()
