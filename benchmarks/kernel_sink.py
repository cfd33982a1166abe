"""A sink in the kernel for capacity runs: media dropped where it enters the receiving host, and
counted there.

On a 2-core machine the harness that receives a server's streams takes the cores the server's
processes would scale into: even the counting receiver (`--receiver count --decode none`) costs
a third of a core at 90k packets/s. Here the server and the harness run in a network namespace
of their own, and two rules in its `raw` table, the first netfilter hook a received packet
meets, before connection tracking and before any socket is looked up, take the media off:

- RTP (version 2) of a dynamic payload type (96-127) without the marker bit is counted and
  dropped: no user-space receiver ever wakes for it;
- RTP with the marker bit (a frame's last packet) is counted and passed on, so the harness
  still sees every frame end, its timing and its freezes, at one packet a frame.

SRTP leaves the RTP header in the clear, so the rules read it as the harness's counting receiver
does. STUN (first byte 0-3), DTLS (20-63) and RTCP (second byte 200-207, outside both ranges)
pass, so ICE consent, the data channel and the receiver reports work as before. The harness's
own report then counts lost packets (every one dropped here); the server, with REMB clients,
does not act on reported loss (`transport.send_path`: REMB mode obeys REMB alone).

The loopback device cuts UDP_SEGMENT sends into datagrams only after netfilter, so a segmented
run of a frame's packets would meet the rules as one packet with the first datagram's header:
in the namespace, `ethtool` turns loopback's UDP segmentation offload off, and the kernel cuts
each run in software before the device (the sender's system call pays for it, as on a NIC
without UDP segmentation offload), so every datagram is counted.

Needs root, `unshare`, `ip`, `iptables` (with the u32 match) and `ethtool`; `missing` says
which is not there. The namespaces live as long as the process that `reexec` starts in them.
"""

from __future__ import annotations

import ctypes
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Final, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loadtest import cpu_between  # noqa: E402  (benchmarks/loadtest.py)

ENV: Final = "RENDER_SERVER_KERNEL_SINK_NAMESPACE"
# aioice gathers no loopback address: the namespace needs another for the host candidates (a
# veth pair's end; traffic to it still goes through loopback, where the rules are)
ADDRESS: Final = "10.231.0.1/24"
_RTP: Final = "0>>22&0x3C@8>>24&0xC0=0x80"  # the UDP payload's first byte: RTP version 2
_SECOND: Final = "0>>22&0x3C@8>>16&0xFF"  # its second byte: marker bit, payload type
MARKER: Final = "kernel-sink-marker"
DROP: Final = "kernel-sink-drop"
MARKER_RULE: Final = ["-p", "udp", "-m", "u32", "--u32", f"{_RTP}&&{_SECOND}=224:255",
                      "-m", "comment", "--comment", MARKER, "-j", "ACCEPT"]  # fmt: skip
DROP_RULE: Final = ["-p", "udp", "-m", "u32", "--u32", f"{_RTP}&&{_SECOND}=96:127",
                    "-m", "comment", "--comment", DROP, "-j", "DROP"]  # fmt: skip
SAMPLE_S: Final = 0.5  # counters read this often (an iptables process each time)


def missing() -> str | None:
    """Why the kernel sink cannot run here, or None."""
    if os.geteuid() != 0:
        return "not root (it needs a network namespace and iptables)"
    for tool in ("unshare", "ip", "iptables", "ethtool"):
        if shutil.which(tool) is None:
            return f"no `{tool}` on PATH"
    return None


def in_namespace() -> bool:
    return os.environ.get(ENV) == "1"


def reexec(script: str, argv: list[str]) -> int:
    """Run `script argv` again in a new network namespace; its exit status. It runs as the
    first process of a PID namespace too, so that when it dies, however it dies, the kernel
    ends every server and harness it started (and the namespace, rules and all, goes with
    them); and `unshare` is killed with this process, taking the namespace down as well."""
    command = ["unshare", "--net", "--pid", "--fork", "--mount-proc", "--kill-child", "--",
               sys.executable, script, *argv]  # fmt: skip
    return subprocess.run(
        command, env={**os.environ, ENV: "1"}, preexec_fn=_die_with_parent
    ).returncode


def _die_with_parent() -> None:
    """In the child before it runs `unshare`: SIGKILL it when this process dies."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def prepare_namespace() -> None:
    """Loopback up, and an address for ICE's host candidates."""
    _run("ip", "link", "set", "lo", "up")
    _run("ip", "link", "add", "sink0", "type", "veth", "peer", "name", "sink1")
    _run("ip", "addr", "add", ADDRESS, "dev", "sink0")
    _run("ip", "link", "set", "sink0", "up")
    _run("ip", "link", "set", "sink1", "up")


class Counts(NamedTuple):
    """Packets and IP bytes the rules saw: frame ends passed on, the rest dropped."""

    markers: int = 0
    marker_bytes: int = 0
    dropped: int = 0
    dropped_bytes: int = 0

    @property
    def packets(self) -> int:
        return self.markers + self.dropped

    @property
    def bytes(self) -> int:
        return self.marker_bytes + self.dropped_bytes


class KernelSink:
    """The two rules on loopback (in the namespace `prepare_namespace` set up), their counters
    sampled every `SAMPLE_S` on time.monotonic() milliseconds while inside `with`."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, Counts]] = []
        self._stop = threading.Event()
        self._failed: BaseException | None = None  # what stopped the sampler
        self._thread = threading.Thread(target=self._sample, name="kernel-sink", daemon=True)

    def __enter__(self) -> KernelSink:
        if not in_namespace():
            raise RuntimeError("the kernel sink drops media on loopback: only in its namespace")
        _run("ethtool", "-K", "lo", "tx-udp-segmentation", "off")
        _raw("-A", "PREROUTING", *MARKER_RULE)
        _raw("-A", "PREROUTING", *DROP_RULE)
        self.samples.append((time.monotonic() * 1e3, self.counts()))  # covers from here on
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        _raw("-D", "PREROUTING", *DROP_RULE)
        _raw("-D", "PREROUTING", *MARKER_RULE)
        _run("ethtool", "-K", "lo", "tx-udp-segmentation", "on")

    def counts(self) -> Counts:
        """The rules' counters now."""
        listing = _raw("-L", "PREROUTING", "-v", "-x", "-n")
        found: dict[str, tuple[int, int]] = {}
        for line in listing.splitlines():
            for name in (MARKER, DROP):
                if f"/* {name} */" in line:
                    packets, octets = line.split()[:2]
                    found[name] = (int(packets), int(octets))
        if len(found) != 2:
            raise RuntimeError(f"the kernel sink's rules are not in place:\n{listing}")
        return Counts(*found[MARKER], *found[DROP])

    def between(self, start_ms: float, end_ms: float) -> Counts:
        """What the rules counted between two instants (time.monotonic() ms), read off the
        samples by linear interpolation; RuntimeError where they do not cover the window."""
        # each counter as `cpu_between` reads the server's CPU seconds: the same interpolation
        counts = [
            cpu_between([(ms, sample[i]) for ms, sample in self.samples], start_ms, end_ms)
            for i in range(len(Counts._fields))
        ]
        if any(math.isnan(count) for count in counts):
            raise RuntimeError(f"no kernel sink samples around {start_ms:.0f}-{end_ms:.0f} ms")
        return Counts(*(round(count) for count in counts))

    def _sample(self) -> None:
        try:
            while not self._stop.wait(SAMPLE_S):
                self.samples.append((time.monotonic() * 1e3, self.counts()))
            self.samples.append((time.monotonic() * 1e3, self.counts()))
        except BaseException as exc:  # told by `between`, not lost in the thread
            self._failed = exc


def _raw(*arguments: str) -> str:
    """iptables on the `raw` table, waiting for the lock (the sampler lists while rules change)."""
    return _run("iptables", "-w", "-t", "raw", *arguments)


def _run(*command: str) -> str:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout
