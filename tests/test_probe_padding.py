"""A probe cluster under way (`Prober`): media the pacer lets out counts toward it, so padding
only fills what the media left of the cluster's rate and size; and a probe waits until what
was sent has crossed the bottleneck at the estimate (`LinkBacklog`)."""

from __future__ import annotations

import pytest

from render_server.transport.congestion import ProbeCluster
from render_server.transport.probe_padding import BACKLOG_WAIT_S, LinkBacklog, Prober

OVERHEAD = 38


def test_media_sent_during_a_probe_counts_toward_it() -> None:
    prober = Prober(sender=None, overhead=OVERHEAD)
    prober.begin(10.0, lambda _: ProbeCluster(1, 4_000_000, 5, 7500))
    run = prober.run
    assert run is not None and run.due(10.0)  # nothing sent yet: padding is due
    prober.sent([bytes(1200)] * 4, 10.0)  # a frame's packets leave at once
    assert not run.due(10.0)  # 4.9 kB ahead of the rate: no padding on top of them
    assert run.due(10.015)  # 15 ms on, the rate allows more
    prober.sent([bytes(1200)] * 2, 10.015)
    assert prober.run is run  # 6 packets, 7.4 kB: not yet the cluster's 7.5 kB
    prober.sent([bytes(200)], 10.015)
    assert prober.run is None  # done with media alone
    assert prober.started == 1


def test_the_backlog_clears_once_what_was_sent_crossed_the_link() -> None:
    backlog = LinkBacklog()
    assert backlog.clear(0.0)
    backlog.add([bytes(1212)] * 10, OVERHEAD, 1.0, 1_000_000)  # 100 kbit at 1 Mbit/s
    assert not backlog.clear(1.099)
    assert backlog.clear(1.1)
    backlog.add([bytes(1212)], OVERHEAD, 1.05, 1_000_000)  # queued behind the rest
    assert not backlog.clear(1.109) and backlog.clear(1.11)


def test_a_probe_waits_for_the_backlog_but_not_forever() -> None:
    """A stream that fills its estimate always has a backlog: the probe goes after
    BACKLOG_WAIT_S anyway, instead of being dropped by the controller a second later."""
    clusters = iter([ProbeCluster(1, 4_000_000, 5, 7500)])
    prober = Prober(sender=None, overhead=OVERHEAD)
    prober.backlog.add([bytes(1212)] * 10, OVERHEAD, 1.0, 1_000_000)  # clear at 1.1
    prober.begin(1.0, lambda _: next(clusters, None))
    assert prober.run is None and prober.wait(1.0) == pytest.approx(BACKLOG_WAIT_S)
    prober.begin(1.05, lambda _: next(clusters, None))
    assert prober.run is None  # still waiting, the cluster kept (not asked for again)
    prober.backlog.add([bytes(1212)] * 100, OVERHEAD, 1.05, 1_000_000)  # it keeps filling
    prober.begin(1.0 + BACKLOG_WAIT_S, lambda _: next(clusters, None))
    assert prober.run is not None and prober.run.cluster.id == 1
    assert prober.wait(1.1) == pytest.approx(0.001)


def test_a_probe_that_media_filled_early_ends_no_sooner_than_its_rate() -> None:
    """The pacer lets media out at 2.5x the estimate: a cluster filled by it in 8 ms would be
    read at twice its rate, and a browser that bunched its first packets made the receive
    rate over twice the send rate, which the estimate discards. The cluster's last packet
    goes when its rate would have sent it."""
    prober = Prober(sender=None, overhead=OVERHEAD)
    prober.begin(10.0, lambda _: ProbeCluster(1, 3_740_000, 5, 7012))
    run = prober.run
    assert run is not None
    prober.sent([bytes(1200)] * 3, 10.0)
    prober.sent([bytes(1100)] * 5, 10.008)  # 8.9 kB in 8 ms: bytes and packets enough
    assert prober.run is run and not run.done()
    assert not run.due(10.012)  # ahead of the rate: nothing yet
    assert run.due(10.019)  # the rate caught up: one more packet, and the cluster spans 19 ms
    run.count(1238, 10.019)
    assert run.done()


def test_a_padding_only_probe_ends_at_its_bytes() -> None:
    prober = Prober(sender=None, overhead=OVERHEAD)
    prober.begin(10.0, lambda _: ProbeCluster(1, 4_000_000, 5, 7500))
    run = prober.run
    assert run is not None
    now, packets = 10.0, 0
    while not run.done():
        if run.due(now):
            run.count(1238, now)
            packets += 1
        now += 0.0005
    assert packets == 7 and 0.012 < run.last - run.started < 0.014
