"""TURN for real: a coturn started here (use-auth-secret, the secret signaling mints per-session
credentials from) beside the server in the network lab, and a client in the other namespace
that may only use relayed candidates (ICE policy relay), over UDP and over TCP to the TURN
server. The relayed stream's glass-to-glass stays near the direct path's; a wrong secret
leaves the relay-only client without a path at all (so the relay really carried the others)."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.netlab import LinkProfile, NetLab, lab_available

pytestmark = pytest.mark.skipif(lab_available() is not None, reason=str(lab_available()))

SECRET = "lab-turn-secret"
RTT_MS = 20


@pytest.fixture(scope="module")
def lab() -> Iterator[NetLab]:
    if shutil.which("turnserver") is None:
        pytest.fail("coturn's turnserver is missing: apt-get install coturn (CI does)")
    with NetLab(LinkProfile(rtt_ms=RTT_MS)) as lab:
        lab.start_turn(SECRET)
        yield lab


def latency(lab: NetLab, url: str, *args: str) -> Any:
    return lab.run(
        "client",
        [sys.executable, "-m", "render_server", "latency", "--url", url, "--seconds", "3",
         "--json", *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.fixture(scope="module")
def direct(lab: NetLab) -> dict[str, Any]:
    done = latency(lab, lab.serve(8090, "--resolution", "640x360"))
    assert done.returncode == 0, done.stderr[-2000:]
    report: dict[str, Any] = json.loads(done.stdout)
    return report


@pytest.mark.parametrize(("transport", "port"), [("udp", 8091), ("tcp", 8092)])
def test_a_relay_only_client_streams_through_coturn(
    lab: NetLab, direct: dict[str, Any], transport: str, port: int
) -> None:
    turn = f"turn:{lab.server_side_ip}:3478?transport={transport}"
    url = lab.serve(port, "--resolution", "640x360", "--turn-url", turn, "--turn-secret", SECRET)
    done = latency(lab, url, "--relay")
    assert done.returncode == 0, done.stderr[-2000:]
    relayed = json.loads(done.stdout)
    g2g, g2g_direct = relayed["glass_to_glass"]["p50"], direct["glass_to_glass"]["p50"]
    print(f"TURN/{transport}: {relayed['frames']} frames, glass-to-glass p50 {g2g:.1f} ms "
          f"(direct {g2g_direct:.1f}), clock rtt {relayed['clock']['rtt_ms']:.1f}")  # fmt: skip
    assert relayed["frames"] >= 30
    assert RTT_MS - 2 <= relayed["clock"]["rtt_ms"] <= RTT_MS + 15
    assert g2g <= g2g_direct + 15.0  # the benchmark holds the tight bound


def test_a_relay_only_client_gets_nowhere_with_a_wrong_secret(lab: NetLab) -> None:
    turn = f"turn:{lab.server_side_ip}:3478?transport=udp"
    url = lab.serve(
        8093, "--resolution", "640x360", "--turn-url", turn, "--turn-secret", "not-the-secret"
    )
    done = latency(lab, url, "--relay")
    print(f"wrong secret: {done.stderr.strip()[-300:]}")
    assert done.returncode != 0, "a relay-only client connected without a TURN allocation"
    assert "TimeoutError" in done.stderr  # no media path: the relay refused it
