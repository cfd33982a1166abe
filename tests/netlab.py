"""A network lab: a server host and a client host in network namespaces of their own, joined only
through a router namespace whose forwarding runs through a user-space link emulator.

    server ns          router ns                                   client ns
    s0 10.X.1.2 ── veth ── r1 10.X.1.1 ┐            ┌ r2 10.X.2.1 ── veth ── c0 10.X.2.2
                                        └─ lab0 (TUN) ┘
                               tests/link_emulator.py: delay, jitter, loss

Every packet the router forwards (either way) is policy-routed into the TUN device `lab0`; the
emulator (tests/link_emulator.py) holds it for half the round-trip time plus jitter, or drops
it, and writes it back, and the kernel routes it out to its host, through a `tbf` on each of
the router's veths where the profile limits the rate. This kernel has `tbf` but no `netem`:
delay and loss are the emulator's, the rate the kernel's. Nothing else connects the two hosts
(no default route leaves the lab), and `NetLab` removes the namespaces, their links and the
emulator when it closes, even after a failure. Needs root (CI runs as root), `ip` and `tc`.

    with NetLab(LinkProfile(rtt_ms=40, loss=0.02, rate_kbit=8000)) as lab:
        server = lab.popen("server", ["render-server", "serve", "--host", lab.server_ip])
        ...
        lab.set_profile(LinkProfile(rtt_ms=40, rate_kbit=2000))  # a step, at once
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from tests.link_emulator import LinkProfile

__all__ = [
    "SHOWN_CLOSE_JS", "SHOWN_OPEN_JS", "SHOWN_SUMMARY_JS", "LinkProfile", "NetLab",
    "lab_available",
]  # fmt: skip

ROOT = Path(__file__).resolve().parents[1]
Host = Literal["server", "client", "router"]
_labs = itertools.count(1)
SERVER_START_S = 60.0
FETCH = """
import sys, urllib.request
print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())
"""

# Chromium measured from inside the client namespace: this script runs there (Playwright's pipe
# to a browser started through `ip netns exec` never opened) and prints the page's summary.
# argv: url, seconds of drag, viewport width and height, the three page scripts
IN_LAB_CHROMIUM = """
import json, sys
from render_server.tools.measure.browser import measure_in_chromium
url, seconds, width, height, before, after, summary = sys.argv[1:8]
print(json.dumps(measure_in_chromium(url, float(seconds), viewport=(int(width), int(height)),
    before_drag=before, after_drag=after, summary_script=summary, first_moves=0)))
"""
# the page scripts of a drag window that keeps every displayed frame's time (`shown`, the
# page's clock), its RTP timestamp and when its last packet arrived (`sent`, from the video
# frame callback's metadata), the compositor's count of frames presented at each callback
# (`presented`: it also counts frames shown between two callbacks of a busy page) and of those
# it replaced before drawing them (`dropped`; tests/frame_gaps.py reads the two), the RTP
# timestamps of every frame the worker sent (`records`, its timing records) beside the SDK's
# latency summary
SHOWN_OPEN_JS = """() => {
  const video = window.renderStream.video;
  window.__shown = [];
  window.__sent = [];  // each shown frame's RTP timestamp and when its last packet came (ms)
  window.__presented = [];  // the compositor's count of frames presented, at each callback
  window.__dropped = [];  // and of those it never drew
  window.__t0 = performance.now();
  // every frame the worker says it sent (its timing records, keyed by RTP timestamp)
  window.__records = [];
  const meter = window.renderStream.latencyMeter, onTiming = meter.onTiming.bind(meter);
  meter.onTiming = (rows) => {
    for (const row of rows) {
      if (Array.isArray(row) && row[0] !== null) window.__records.push(row[0] >>> 0);
    }
    onTiming(rows);
  };
  const tick = (now, meta) => {
    window.__shown.push(now);
    window.__sent.push([meta.rtpTimestamp ?? null, meta.receiveTime ?? null]);
    window.__presented.push(meta.presentedFrames);
    window.__dropped.push(video.getVideoPlaybackQuality().droppedVideoFrames);
    video.requestVideoFrameCallback(tick);
  };
  video.requestVideoFrameCallback(tick);
}"""
SHOWN_CLOSE_JS = "() => { window.__t1 = performance.now(); }"
SHOWN_SUMMARY_JS = """() => {
  const keep = window.__shown.map((t) => t >= window.__t0 && t <= window.__t1);
  return { ...window.renderStream.latency(),
    shown: window.__shown.filter((_, i) => keep[i]),
    sent: window.__sent.filter((_, i) => keep[i]), records: window.__records,
    presented: window.__presented.filter((_, i) => keep[i]),
    dropped: window.__dropped.filter((_, i) => keep[i]),
    t0: window.__t0, t1: window.__t1 };
}"""


def lab_available() -> str | None:
    """None where a lab can be built here, else why not."""
    if os.geteuid() != 0:
        return "the network lab needs root (network namespaces, veth, tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"the network lab needs `{tool}` (iproute2)"
    if not os.path.exists("/dev/net/tun"):
        return "the network lab needs /dev/net/tun"
    return None


def _run(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")


class NetLab:
    """The lab (see the module's docstring); a context manager."""

    def __init__(self, profile: LinkProfile | None = None, subnet: int | None = None) -> None:
        number = next(_labs)
        tag = f"{os.getpid() % 100000}-{number}"
        self.ns: dict[Host, str] = {
            "server": f"rs-s-{tag}",
            "router": f"rs-r-{tag}",
            "client": f"rs-c-{tag}",
        }
        octet = subnet if subnet is not None else 100 + (os.getpid() + number) % 100
        self.server_ip = f"10.{octet}.1.2"
        self.server_side_ip = f"10.{octet}.1.3"  # a second host on the server's side (TURN)
        self.client_ip = f"10.{octet}.2.2"
        self._router_ips = (f"10.{octet}.1.1", f"10.{octet}.2.1")
        self.profile = profile or LinkProfile()
        self._dir = Path(tempfile.mkdtemp(prefix="netlab-"))
        self._profile_path = self._dir / "profile.json"
        self._emulator: subprocess.Popen[str] | None = None
        self._processes: list[subprocess.Popen[Any]] = []
        self.turn: subprocess.Popen[Any] | None = None  # coturn, once start_turn ran

    # -- life -----------------------------------------------------------------------------

    def __enter__(self) -> NetLab:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _build(self) -> None:
        for ns in self.ns.values():
            _run("ip", "netns", "add", ns)
        s, r, c = self.ns["server"], self.ns["router"], self.ns["client"]
        r1, r2 = self._router_ips
        _run("ip", "link", "add", "s0", "netns", s, "type", "veth", "peer", "r1", "netns", r)
        _run("ip", "link", "add", "c0", "netns", c, "type", "veth", "peer", "r2", "netns", r)
        for ns, dev, address, gateway in (
            (s, "s0", self.server_ip, r1),
            (c, "c0", self.client_ip, r2),
        ):
            self._ip(ns, "addr", "add", f"{address}/24", "dev", dev)
            self._ip(ns, "link", "set", dev, "up")
            self._ip(ns, "link", "set", "lo", "up")
            self._ip(ns, "route", "add", "default", "via", gateway)
        self._ip(s, "addr", "add", f"{self.server_side_ip}/24", "dev", "s0")
        self._ip(r, "addr", "add", f"{r1}/24", "dev", "r1")
        self._ip(r, "addr", "add", f"{r2}/24", "dev", "r2")
        for dev in ("r1", "r2", "lo"):
            self._ip(r, "link", "set", dev, "up")
        self._ip(r, "tuntap", "add", "dev", "lab0", "mode", "tun")
        self._ip(r, "link", "set", "lab0", "up")
        for key in ("net.ipv4.ip_forward=1", "net.ipv4.conf.all.rp_filter=0",
                    "net.ipv4.conf.default.rp_filter=0", "net.ipv4.conf.lab0.rp_filter=0",
                    "net.ipv4.conf.r1.rp_filter=0", "net.ipv4.conf.r2.rp_filter=0"):  # fmt: skip
            _run("ip", "netns", "exec", r, "sysctl", "-q", "-w", key)
        # forwarded packets from either host go into the emulator; what it writes back
        # (arriving on lab0) takes the main table to its host
        self._ip(r, "route", "add", "default", "dev", "lab0", "table", "100")
        self._ip(r, "rule", "add", "iif", "r1", "table", "100", "pref", "100")
        self._ip(r, "rule", "add", "iif", "r2", "table", "100", "pref", "101")
        self._write_profile(self.profile)
        self._apply_rate(self.profile, first=True)
        self._emulator = subprocess.Popen(
            ["ip", "netns", "exec", r, sys.executable, "-m", "tests.link_emulator",
             "--tun", "lab0", "--profile", str(self._profile_path)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        assert self._emulator.stdout is not None
        line = self._emulator.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(
                f"the link emulator did not start: {line}{self._emulator.stdout.read()}"
            )

    def close(self) -> None:
        """Stop what runs in the lab and remove it (safe to call twice)."""
        for process in [*self._processes, *([self._emulator] if self._emulator else [])]:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(5)
        self._processes.clear()
        self._emulator = None
        for ns in self.ns.values():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)  # its links with it
        shutil.rmtree(self._dir, ignore_errors=True)

    # -- the path ---------------------------------------------------------------------------

    def set_profile(self, profile: LinkProfile) -> None:
        """The path changes at once: the emulator rereads its profile, tbf its rate."""
        self._write_profile(profile)
        self._apply_rate(profile, first=False)
        if self._emulator is not None:
            self._emulator.send_signal(1)  # SIGHUP
        self.profile = profile

    def _write_profile(self, profile: LinkProfile) -> None:
        temporary = self._profile_path.with_suffix(".tmp")
        temporary.write_text(json.dumps(profile.as_dict()))
        temporary.replace(self._profile_path)

    def _apply_rate(self, profile: LinkProfile, first: bool) -> None:
        r = self.ns["router"]
        for dev in ("r1", "r2"):
            if profile.rate_kbit is None:
                if not first:
                    subprocess.run(["ip", "netns", "exec", r, "tc", "qdisc", "del", "dev", dev,
                                    "root"], capture_output=True)  # fmt: skip
                continue
            rate = f"{profile.rate_kbit}kbit"
            # a buffer of ~50 ms at the rate (at least 64 kB): what a home router holds
            limit = max(64_000, profile.rate_kbit * 1000 // 8 // 20)
            # a bucket of 2 ms at the rate (two packets at least): a link that serializes at
            # its rate; a 32 kB bucket let a 2 Mbit/s link pass 128 ms of bursts at any speed,
            # so that a congestion controller's probes read it as many times faster
            burst = max(3000, profile.rate_kbit * 1000 // 8 // 500)
            _run("ip", "netns", "exec", r, "tc", "qdisc", "replace", "dev", dev, "root", "tbf",
                 "rate", rate, "burst", str(burst), "limit", str(limit))  # fmt: skip

    # -- processes --------------------------------------------------------------------------

    def command(self, host: Host, argv: Sequence[str]) -> list[str]:
        """`argv` run inside `host`'s namespace."""
        return ["ip", "netns", "exec", self.ns[host], *argv]

    def popen(self, host: Host, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start `argv` in `host`'s namespace; the lab stops it when it closes."""
        process = subprocess.Popen(self.command(host, argv), **kwargs)
        self._processes.append(process)
        return process

    def run(self, host: Host, argv: Sequence[str], timeout: float = 60, **kwargs: Any) -> Any:
        """Run `argv` in `host`'s namespace to its end (subprocess.run's result)."""
        return subprocess.run(self.command(host, argv), timeout=timeout, **kwargs)

    def fetch(self, url: str, host: Host = "client") -> str:
        """The body of a GET of `url` from `host` (its text; RuntimeError if it fails)."""
        done = self.run(host, [sys.executable, "-c", FETCH, url], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"GET {url} from {host}: {done.stderr.strip()[-300:]}")
        return str(done.stdout)

    def serve(self, port: int, *args: str) -> str:
        """`render-server serve` on the server host (on its address, without auth, `args`
        added), stopped with the lab; its URL once the client host sees it ready."""
        url = f"http://{self.server_ip}:{port}"
        log: Any = subprocess.DEVNULL
        if keep := os.environ.get("RENDER_SERVER_LAB_LOGS"):  # a benchmark's runs, kept to read
            Path(keep).mkdir(parents=True, exist_ok=True)
            log = open(Path(keep) / f"serve-{port}-{time.strftime('%H%M%S')}.log", "w")  # noqa: SIM115
        self.popen(
            "server",
            [sys.executable, "-m", "render_server", "serve", "--host", self.server_ip, "--port",
             str(port), "--auth", "off", *args],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log,
        )  # fmt: skip
        if log is not subprocess.DEVNULL:
            log.close()  # the server holds its own copy of the descriptor
        ready = "import urllib.request, sys; urllib.request.urlopen(sys.argv[1], timeout=1)"
        deadline = time.monotonic() + SERVER_START_S
        while self.run("client", [sys.executable, "-c", ready, url + "/readyz"],
                       capture_output=True).returncode != 0:  # fmt: skip
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server did not come up in the lab in {SERVER_START_S} s")
            time.sleep(0.3)
        return url

    def start_turn(self, secret: str) -> str:
        """coturn (use-auth-secret with `secret`, UDP and TCP on 3478, no TLS) on the server
        side's second address, stopped with the lab (or killed through `turn`, its process);
        that address."""
        ip = self.server_side_ip
        self.turn = self.popen(
            "server",
            ["turnserver", "-n", f"--listening-ip={ip}", f"--relay-ip={ip}",
             "--listening-port=3478", "--use-auth-secret", f"--static-auth-secret={secret}",
             "--realm=lab", "--no-tls", "--no-dtls", "--no-cli", "--min-port=49160",
             "--max-port=49400"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        return ip

    def chromium_argv(
        self,
        url: str,
        seconds: float,
        viewport: tuple[int, int],
        before: str = SHOWN_OPEN_JS,
        after: str = SHOWN_CLOSE_JS,
        summary: str = SHOWN_SUMMARY_JS,
    ) -> list[str]:
        """What, run in the client host (`popen("client", ...)`), drives headless Chromium on
        the page at `url`, dragging for `seconds` between the `before` and `after` page
        scripts, and prints `summary`'s JSON."""
        width, height = viewport
        return [sys.executable, "-c", IN_LAB_CHROMIUM, url, str(seconds), str(width),
                str(height), before, after, summary]  # fmt: skip

    def chromium(self, url: str, seconds: float, viewport: tuple[int, int]) -> dict[str, Any]:
        """`chromium_argv` with the SHOWN_ scripts, run to its end: the page's summary."""
        done = self.run(
            "client", self.chromium_argv(url, seconds, viewport),
            capture_output=True, text=True, timeout=seconds + 180, cwd=ROOT,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"Chromium in the lab: {done.stderr[-1500:]}")
        summary: dict[str, Any] = json.loads(done.stdout)
        return summary

    def _ip(self, ns: str, *argv: str) -> None:
        _run("ip", "-n", ns, *argv)
