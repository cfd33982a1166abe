"""Streams over impaired links in the network lab (tests/netlab.py), each against the same
stream on a clean link (or the direct path) measured in the same run.

1. Chromium on a lossy link: `render-server serve` (CPU renderer, 1280x720 at 30 fps) in the
   lab's server namespace, headless Chromium in its client namespace (Playwright launches it
   through `ip netns exec`), the designer page dragged for `--seconds`. Over the drag: frames
   displayed (requestVideoFrameCallback), their rate, freezes (a gap over three frame
   intervals) and the longest gap, input-to-photon from the SDK's meter. First on a clean
   link with the same round trip (the baseline), then on 40 ms RTT, 2 % random loss each way,
   8 Mbit/s: the issue's first target is ≥ 29 fps and no freeze over 200 ms.
2. TURN: the Python latency client in the client namespace, direct, then relay-only through a
   coturn beside the server (UDP), alternating `--runs` times on a 20 ms link; glass-to-glass
   p50 of each (the issue's target: the relay within 5 ms of the direct path).

    python benchmarks/network.py [--seconds 10] [--runs 3] [--json]

Root only (namespaces); needs coturn's `turnserver` for part 2.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.netlab import LinkProfile, NetLab, lab_available  # noqa: E402

SECRET = "bench-turn-secret"
FRAME_INTERVAL_MS = 1000 / 30
# the drag's window, as benchmarks/latency.py's: every displayed frame's time kept in the page
OPEN_JS = """() => {
  const video = window.renderStream.video;
  window.__shown = [];
  window.__t0 = performance.now();
  const tick = (now) => { window.__shown.push(now); video.requestVideoFrameCallback(tick); };
  video.requestVideoFrameCallback(tick);
}"""
CLOSE_JS = "() => { window.__t1 = performance.now(); }"
SUMMARY_JS = """() => {
  const shown = window.__shown.filter((t) => t >= window.__t0 && t <= window.__t1);
  return { ...window.renderStream.latency(), shown, t0: window.__t0, t1: window.__t1,
           frames: window.renderStream.latencyMeter.frames.length };
}"""


def serve(lab: NetLab, port: int, *args: str) -> str:
    url = f"http://{lab.server_ip}:{port}"
    lab.popen(
        "server",
        [sys.executable, "-m", "render_server", "serve", "--host", lab.server_ip, "--port",
         str(port), "--auth", "off", "--renderer", "cpu", *args],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    ready = "import urllib.request, sys; urllib.request.urlopen(sys.argv[1], timeout=1)"
    deadline = time.monotonic() + 60
    while lab.run("client", [sys.executable, "-c", ready, url + "/readyz"],
                  capture_output=True).returncode != 0:  # fmt: skip
        if time.monotonic() > deadline:
            raise RuntimeError("the server did not come up in the lab")
        time.sleep(0.3)
    return url


def gaps(shown: list[float]) -> dict[str, Any]:
    steps = [b - a for a, b in zip(shown, shown[1:], strict=False)]
    freezes = [g for g in steps if g > 3 * FRAME_INTERVAL_MS]
    return {
        "longest_gap_ms": max(steps, default=0.0),
        "freezes": len(freezes),
        "freezes_over_200ms": sum(1 for g in freezes if g > 200),
    }


# run inside the client namespace (Playwright's pipe to a browser started through `ip netns
# exec` never opened): the page's summary as JSON on stdout
IN_LAB = """
import json, sys
from render_server.tools.measure.browser import measure_in_chromium
url, seconds, open_js, close_js, summary_js = sys.argv[1:6]
print(json.dumps(measure_in_chromium(url, float(seconds), viewport=(1280, 720),
    before_drag=open_js, after_drag=close_js, summary_script=summary_js, first_moves=0)))
"""


def chromium_run(lab: NetLab, url: str, seconds: float) -> dict[str, Any]:
    done = lab.run(
        "client",
        [sys.executable, "-c", IN_LAB, url, str(seconds), OPEN_JS, CLOSE_JS, SUMMARY_JS],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"Chromium in the lab: {done.stderr[-1500:]}")
    summary = json.loads(done.stdout)
    shown = summary["shown"]
    window_s = (summary["t1"] - summary["t0"]) / 1000
    return {
        "codec": summary.get("codec"),
        "shown": len(shown),
        "fps": len(shown) / window_s if window_s else 0.0,
        "i2p_p50": summary["inputToPhoton"]["p50"],
        "g2g_p50": summary["glassToGlass"]["p50"],
        **gaps(shown),
    }


def lossy_link(seconds: float) -> dict[str, Any]:
    clean = LinkProfile(rtt_ms=40)
    lossy = LinkProfile(rtt_ms=40, loss=0.02, rate_kbit=8000)
    out: dict[str, Any] = {}
    with NetLab(clean) as lab:
        url = serve(lab, 8080, "--resolution", "1280x720", "--fps", "30")
        for name, profile in (("clean 40 ms", clean), ("40 ms, 2 % loss, 8 Mbit/s", lossy)):
            lab.set_profile(profile)
            print(f"chromium over {name} ...", file=sys.stderr, flush=True)
            out[name] = chromium_run(lab, url, seconds)
    return out


def relay_vs_direct(runs: int) -> dict[str, Any]:
    results: dict[str, list[float]] = {"direct": [], "relay (TURN/UDP)": []}
    with NetLab(LinkProfile(rtt_ms=20)) as lab:
        ip = lab.server_side_ip
        lab.popen(
            "server",
            ["turnserver", "-n", f"--listening-ip={ip}", f"--relay-ip={ip}",
             "--listening-port=3478", "--use-auth-secret", f"--static-auth-secret={SECRET}",
             "--realm=lab", "--no-tls", "--no-dtls", "--no-cli", "--min-port=49160",
             "--max-port=49400"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        url = serve(lab, 8080, "--resolution", "1280x720", "--turn-url",
                    f"turn:{ip}:3478?transport=udp", "--turn-secret", SECRET)  # fmt: skip
        for _ in range(runs):
            for name, extra in (("direct", []), ("relay (TURN/UDP)", ["--relay"])):
                print(f"{name} ...", file=sys.stderr, flush=True)
                done = lab.run(
                    "client",
                    [sys.executable, "-m", "render_server", "latency", "--url", url,
                     "--seconds", "4", "--json", *extra],
                    capture_output=True, text=True, timeout=120,
                )  # fmt: skip
                if done.returncode != 0:
                    raise RuntimeError(f"{name}: {done.stderr[-500:]}")
                results[name].append(json.loads(done.stdout)["glass_to_glass"]["p50"])
    return results


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )  # fmt: skip
    parser.add_argument("--seconds", type=float, default=10.0, help="Chromium's drag per link")
    parser.add_argument("--runs", type=int, default=3, help="direct/relay pairs")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    unavailable = lab_available()
    if unavailable:
        print(f"network.py: {unavailable}", file=sys.stderr)
        return 2
    links = lossy_link(args.seconds)
    relay = relay_vs_direct(args.runs)
    if args.json:
        print(json.dumps({"links": links, "relay": relay}, indent=2))
        return 0
    print("Chromium, 1280x720 at 30 fps, drag window (ms)")
    print(f"{'link':<28}{'shown':>7}{'fps':>7}{'i2p p50':>9}{'g2g p50':>9}{'freezes':>9}"
          f"{'>200ms':>8}{'longest':>9}")  # fmt: skip
    for name, r in links.items():
        print(f"{name:<28}{r['shown']:>7}{r['fps']:>7.1f}{r['i2p_p50'] or 0:>9.1f}"
              f"{r['g2g_p50'] or 0:>9.1f}{r['freezes']:>9}{r['freezes_over_200ms']:>8}"
              f"{r['longest_gap_ms']:>9.0f}")  # fmt: skip
    direct, relayed = relay["direct"], relay["relay (TURN/UDP)"]
    print(f"\nglass-to-glass p50 on a 20 ms link, python client, {len(direct)} runs each:")
    print(f"  direct {', '.join(f'{v:.1f}' for v in direct)}; relay "
          f"{', '.join(f'{v:.1f}' for v in relayed)}; relay − direct (medians): "
          f"{statistics.median(relayed) - statistics.median(direct):+.1f} ms")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
