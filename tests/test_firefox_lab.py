"""Real Firefox on an impaired link: firefox-esr (tests/firefox.py) in the network lab's client
namespace, 40 ms from `render-server serve` with 2 % random loss each way and 8 Mbit/s, the
designer page dragged. Firefox takes its own path through everything the paced send path
does: VP8 (its offer has no H.264), its own transport-cc feedback and NACKs, and its own RED
and ULPFEC. Loose bounds for CI, as for Chromium in test_netlab.py."""

from __future__ import annotations

import json
import os
import sys

import pytest

from tests.firefox import FIREFOX_CANDIDATES
from tests.netlab import ROOT, LinkProfile, NetLab, lab_available

pytestmark = [
    pytest.mark.skipif(lab_available() is not None, reason=str(lab_available())),
    pytest.mark.skipif(
        not any(os.path.exists(p) for p in FIREFOX_CANDIDATES),
        reason="firefox-esr is not installed",
    ),
]

# runs in the client namespace (Marionette's port is on that namespace's loopback): opens the
# page, waits for the stream, drags for argv[2] seconds while every shown frame's time is kept,
# prints the frames, the page's `network` message and Firefox's inbound video statistics
IN_LAB_FIREFOX = """
import json, sys, time
from tests.firefox import launch_firefox
url, seconds = sys.argv[1], float(sys.argv[2])
with launch_firefox(viewport=(960, 540)) as firefox:
    firefox.navigate(url)
    deadline = time.monotonic() + 60
    while firefox.execute("return window.renderStream?.state ?? null;") != "streaming":
        if time.monotonic() > deadline:
            sys.exit("the stream did not start")
        time.sleep(0.2)
    firefox.wait(1000)
    firefox.execute('''
      const video = window.renderStream.video;
      window.__shown = [];
      const tick = (now) => { window.__shown.push(now); video.requestVideoFrameCallback(tick); };
      video.requestVideoFrameCallback(tick);
      // the page's loss figure is of the last half second: its highest over the drag counts
      window.__lossMax = 0;
      setInterval(() => {
        const loss = window.renderStream.network?.lossPercent ?? 0;
        window.__lossMax = Math.max(window.__lossMax, loss);
      }, 200);
      window.__t0 = performance.now();''')
    box = firefox.evaluate("document.getElementById('stage').getBoundingClientRect().toJSON()")
    cx, cy = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    legs = max(1, int(seconds * 2))
    path = [(cx + (120 if i % 2 == 0 else -120), cy + (20 if i % 4 < 2 else -20))
            for i in range(legs)]
    firefox.drag_over_time((cx, cy), path, 500)
    firefox.execute("window.__t1 = performance.now();")
    result = firefox.execute_async('''
      let inbound = null;
      (await window.renderStream.pc.getStats()).forEach((r) => {
        if (r.type === 'inbound-rtp' && r.kind === 'video') inbound = r;
      });
      return { shown: window.__shown.filter((t) => t <= window.__t1),
               t0: window.__t0, t1: window.__t1, network: window.renderStream.network,
               lossMax: window.__lossMax,
               codec: window.renderStream.session?.codec ?? null, inbound,
               version: navigator.userAgent };''')
print(json.dumps(result))
"""


def _counter(metrics: str, name: str) -> float:
    return sum(float(line.split()[-1]) for line in metrics.splitlines() if line.startswith(name))


def test_firefox_keeps_streaming_over_a_lossy_slow_link() -> None:
    with NetLab(LinkProfile(rtt_ms=40, loss=0.02, rate_kbit=8000)) as lab:
        url = lab.serve(8080, "--resolution", "640x360", "--fps", "30")
        done = lab.run(
            "client", [sys.executable, "-c", IN_LAB_FIREFOX, url, "6"],
            capture_output=True, text=True, timeout=240, cwd=ROOT,
        )  # fmt: skip
        metrics = lab.fetch(url + "/metrics")
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    shown = result["shown"]
    seconds = (result["t1"] - result["t0"]) / 1000
    fps = len(shown) / seconds
    longest = max(b - a for a, b in zip(shown, shown[1:], strict=False))
    inbound = result["inbound"] or {}
    packets = {kind: _counter(metrics, f'worker_paced_packets_total{{kind="{kind}"}}')
               for kind in ("media", "rtx", "retransmission", "fec", "padding")}  # fmt: skip
    resent = _counter(metrics, 'worker_rtp_retransmissions_total{result="resent"}')
    keys = ("packetsLost", "nackCount", "framesDecoded", "framesDropped", "fecPacketsReceived")
    print(
        f"\n{result['version']}: {result['codec']}, {fps:.1f} fps over {seconds:.1f} s, "
        f"longest gap {longest:.0f} ms; page: {result['network']}, most loss seen "
        f"{result['lossMax']} %; "
        f"inbound { ({k: inbound.get(k) for k in keys}) }; sent {packets}, NACKed resent {resent}"
    )
    assert result["codec"] == "VP8"
    assert fps >= 15
    assert longest < 500
    network = result["network"]
    # Firefox's transport-wide feedback drives the controller (not REMB), which sees the loss
    assert network is not None and network["mode"] == "transport-cc", network
    assert result["lossMax"] > 0.5, (result["lossMax"], network)
    # its NACKs answered from the history, and the loss turned into FEC where it offers ULPFEC
    assert resent > 0 and packets["rtx"] + packets["retransmission"] > 0
    assert packets["fec"] > 0.03 * packets["media"]
