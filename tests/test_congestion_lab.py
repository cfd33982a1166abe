"""Congestion control against real Chromium in the network lab: a step from 20 to 2 Mbit/s
and back, with the paced send path. Loose bounds for CI; benchmarks/network.py holds the
issue's (2 s under the new rate, 3 s to latency under 100 ms, 10 s back to full quality)."""

from __future__ import annotations

import pytest

from tests.lab_step import run_step
from tests.netlab import lab_available

pytestmark = pytest.mark.skipif(lab_available() is not None, reason=str(lab_available()))


def test_the_stream_follows_a_step_down_and_back_up() -> None:
    result = run_step("paced", before_s=4.0, low_s=6.0, after_s=10.0)
    under = result["target_under_2mbit_after_s"]
    back = result["target_back_to_90pct_after_step_up_s"]
    network = result["network"]
    print(
        f"target before {result['target_before_bps'] / 1e6:.2f} Mbit/s; under 2 Mbit/s after "
        f"{under} s; back to 90 % after {back} s of the step up; longest gap while low "
        f"{result['longest_gap_after_step_ms']:.0f} ms; the page's last figures {network}"
    )
    assert result["target_before_bps"] > 2_000_000  # the stream had more than the low rate
    assert under is not None and under <= 4.0
    assert result["longest_gap_after_step_ms"] < 1000  # frames kept coming
    assert back is not None and back <= 15.0
    # the page heard the path's figures from the controller (transport-cc, not REMB)
    assert network is not None and network["mode"] == "transport-cc"
    assert network["targetKbps"] > 2000
