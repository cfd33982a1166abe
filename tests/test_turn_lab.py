"""TURN for real: a coturn started here (use-auth-secret, the secret signaling mints per-session
credentials from) beside the server in the network lab, and a client in the other namespace
that may only use relayed candidates (ICE policy relay), over UDP and over TCP to the TURN
server. The relayed stream's glass-to-glass stays near the direct path's; a wrong secret
leaves the relay-only client without a path at all (so the relay really carried the others)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
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
    started = time.monotonic()
    done = latency(lab, url, "--relay")
    took = time.monotonic() - started
    print(f"wrong secret, {took:.1f} s: {done.stderr.strip()[-300:]}")
    assert done.returncode != 0, "a relay-only client connected without a TURN allocation"
    # no media path (the relay refused it), said as soon as ICE gives up, not at the timeout
    assert "no media path: no relayed candidate" in done.stderr, done.stderr[-500:]
    assert took < 15, took


def busy_slots(lab: NetLab, url: str) -> int:
    workers = json.loads(lab.fetch(url + "/api/workers"))["workers"]
    return sum(int(w["slots"]) - int(w["free"]) for w in workers)


def wait_for(condition: Callable[[], bool], seconds: float) -> float:
    """Seconds until `condition` held (polled twice a second); AssertionError after `seconds`."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > seconds:
            raise AssertionError(f"not within {seconds} s")
        time.sleep(0.5)
    return time.monotonic() - start


def test_when_coturn_dies_mid_stream_the_worker_frees_the_slot_and_a_new_relay_works() -> None:
    """coturn killed under a relay-only session: the worker hears no more RTCP from the peer
    (ICE would take a minute and a half to say so: aioice's consent checks, then its wait on
    the dead server's TURN answers), gives the peer its reconnect time and frees the slot;
    coturn started again carries a new relay-only session. The lab and its coturn are this
    test's own: the others keep theirs."""
    with NetLab(LinkProfile(rtt_ms=RTT_MS)) as lab:
        lab.start_turn(SECRET)
        turn = f"turn:{lab.server_side_ip}:3478?transport=udp"
        url = lab.serve(8094, "--resolution", "640x360", "--turn-url", turn,
                        "--turn-secret", SECRET, "--connect-timeout", "5")  # fmt: skip
        client = lab.popen(
            "client",
            [sys.executable, "-m", "render_server", "latency", "--url", url, "--seconds", "90",
             "--relay", "--json"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_for(lambda: busy_slots(lab, url) == 1, 30)
        time.sleep(2)  # streaming through the relay
        assert lab.turn is not None
        lab.turn.kill()
        lab.turn.wait(timeout=10)
        freed = wait_for(lambda: busy_slots(lab, url) == 0, 60)
        print(f"\ncoturn killed: the worker freed the slot {freed:.1f} s later")
        client.kill()
        lab.start_turn(SECRET)
        time.sleep(1)
        done = latency(lab, url, "--relay")
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["frames"] >= 30
    # 10 s without RTCP, at most 5 s to close the peer connection, 5 s for the peer to return
    assert freed <= 30
