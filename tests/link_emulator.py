"""A user-space link emulator on a TUN device: delay, jitter and random loss, each direction.

This kernel has no `netem`, so the lab's router (tests/netlab.py) routes every forwarded packet
into a TUN device; this process reads each packet from it, drops it with the profile's loss
probability, holds it for half the round-trip time (plus up to `jitter_ms`, never letting a
packet overtake the one before it in its direction, as a real path rarely reorders) and writes
it back, whence the kernel routes it on to its destination (through the `tbf` that limits the
rate). The profile is a JSON file (`LinkProfile.as_dict`), read again on SIGHUP.

    ip netns exec ROUTER python -m tests.link_emulator --tun lab0 --profile FILE

Runs until SIGTERM or SIGINT. Prints "ready" on stdout once attached. With
`LINK_EMULATOR_TRACE=FILE` it also writes a line for every RTP or RTCP packet it takes (time,
dropped or not, the sender's address, and the header fields SRTP leaves in the clear: payload
type, sequence number, timestamp, SSRC, size), to see which losses a stream's stalls followed.
"""

from __future__ import annotations

import argparse
import fcntl
import heapq
import json
import os
import random
import select
import signal
import struct
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
MAX_PACKET = 65536
MAX_QUEUE = 20000  # packets held at once; beyond it, dropped (a real buffer is finite too)


@dataclass(frozen=True)
class LinkProfile:
    """A path: round-trip time (split evenly between the two directions), jitter added to each
    packet's one-way delay (uniform 0..jitter_ms), random loss (0..1, each direction), and the
    rate of each direction in kbit/s (None: unlimited; applied by the kernel's tbf)."""

    rtt_ms: float = 0.0
    jitter_ms: float = 0.0
    loss: float = 0.0
    rate_kbit: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> LinkProfile:
        return cls(**{k: doc[k] for k in ("rtt_ms", "jitter_ms", "loss", "rate_kbit") if k in doc})


def open_tun(name: str) -> int:
    """A file descriptor on the (existing, persistent) TUN device `name`, packets without the
    packet-information header."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


class Emulator:
    def __init__(self, fd: int, profile: LinkProfile, seed: int | None = None) -> None:
        self.fd = fd
        self.profile = profile
        self.random = random.Random(seed)
        self.queue: list[tuple[float, int, bytes]] = []  # (due, order, packet)
        self.last_due: dict[bytes, float] = {}  # per destination: no overtaking
        self.order = 0
        self.passed = self.dropped = 0
        trace = os.environ.get("LINK_EMULATOR_TRACE")
        self.trace = open(trace, "a", buffering=1 << 16) if trace else None  # noqa: SIM115

    def take(self, packet: bytes, now: float) -> None:
        profile = self.profile
        if len(packet) < 20 or packet[0] >> 4 != 4:  # IPv4 only in the lab
            return
        lost = bool(profile.loss) and self.random.random() < profile.loss
        if self.trace is not None:
            self.write_trace(packet, now, lost)
        if lost:
            self.dropped += 1
            return
        if len(self.queue) >= MAX_QUEUE:
            self.dropped += 1
            return
        destination = packet[16:20]
        delay = profile.rtt_ms / 2 + self.random.uniform(0, profile.jitter_ms)
        due = max(now + delay / 1000, self.last_due.get(destination, 0.0))
        self.last_due[destination] = due
        self.order += 1
        heapq.heappush(self.queue, (due, self.order, packet))

    def write_trace(self, packet: bytes, now: float, lost: bool) -> None:
        assert self.trace is not None
        start = (packet[0] & 0x0F) * 4 + 8  # past the IPv4 and UDP headers
        if packet[9] != 17 or len(packet) < start + 12 or packet[start] >> 6 != 2:
            return  # not UDP, or not RTP/RTCP (STUN, DTLS)
        head = packet[start : start + 12]
        seq, ts, ssrc = struct.unpack("!HII", head[2:12])
        rtcp = 192 <= head[1] <= 223
        kind = head[1] if rtcp else head[1] & 0x7F  # RTCP's type, or RTP's payload type
        marker = 0 if rtcp else head[1] >> 7
        self.trace.write(
            f"{now:.6f} {int(lost)} {packet[15]} {kind} {marker} {seq} {ts} {ssrc} {len(packet)}\n"
        )

    def release(self, now: float) -> float | None:
        """Write every packet that is due; seconds until the next one (None: none held)."""
        while self.queue and self.queue[0][0] <= now:
            _, _, packet = heapq.heappop(self.queue)
            try:
                os.write(self.fd, packet)
                self.passed += 1
            except BlockingIOError:
                self.dropped += 1
        return None if not self.queue else max(0.0, self.queue[0][0] - now)

    def run(self, profile_path: Path | None) -> None:
        stopping = False
        reload = False

        def stop(*_: object) -> None:
            nonlocal stopping
            stopping = True

        def hup(*_: object) -> None:
            nonlocal reload
            reload = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGHUP, hup)
        while not stopping:
            if reload and profile_path is not None:
                reload = False
                self.profile = LinkProfile.from_dict(json.loads(profile_path.read_text()))
            wait = self.release(time.monotonic())
            try:
                readable, _, _ = select.select([self.fd], [], [], 0.05 if wait is None else wait)
            except InterruptedError:
                continue
            if readable:
                now = time.monotonic()
                for _ in range(256):  # a burst at once, not one packet per wake-up
                    try:
                        packet = os.read(self.fd, MAX_PACKET)
                    except BlockingIOError:
                        break
                    self.take(packet, now)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tun", required=True)
    parser.add_argument("--profile", type=Path, required=True)
    parser.add_argument("--seed", type=int)
    args = parser.parse_args()
    profile = LinkProfile.from_dict(json.loads(args.profile.read_text()))
    emulator = Emulator(open_tun(args.tun), profile, args.seed)
    print("ready", flush=True)
    emulator.run(args.profile)
    if emulator.trace is not None:
        emulator.trace.close()
    print(f"passed {emulator.passed} dropped {emulator.dropped}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
