"""A deterministic link simulator for the congestion controller (sans-IO, no asyncio).

The sender encodes 30 frames a second of target / 30 bytes, splits them into 1200-byte
packets and paces them at the controller's pacing rate; probe clusters the controller asks
for go first, as 1200-byte padding packets at the cluster's bitrate. The path is one
bottleneck: a capacity (bits/s, may change over time), a FIFO queue that drops what would
wait longer than `max_queue_delay`, then a base one-way delay and optional random loss
(seeded). The receiver reports every 50 ms all packets up to the newest arrived (with the
gaps as lost), on its own clock (another origin); the report reaches the sender after the
base delay. Time advances in 1 ms ticks; send and arrival times are exact.

`python -m tests.congestion_sim` prints the scenarios' figures.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from render_server.transport.congestion import (
    CongestionController,
    PacketFeedback,
    ProbeCluster,
    SentPacket,
)

PACKET_BYTES = 1200


class Controller(Protocol):
    def on_packet_sent(self, packet: SentPacket) -> None: ...
    def on_feedback(self, now: float, feedback: Sequence[PacketFeedback]) -> None: ...
    def on_remb(self, now: float, bitrate: int) -> None: ...
    def process(self, now: float) -> None: ...
    def next_probe(self, now: float) -> ProbeCluster | None: ...
    @property
    def target_bitrate(self) -> int: ...
    @property
    def pacing_bitrate(self) -> int: ...


def steps(*changes: tuple[float, float]) -> Callable[[float], float]:
    """A capacity that is `bps` from each `(time, bps)` on."""

    def capacity(t: float) -> float:
        current = changes[0][1]
        for start, bps in changes:
            if t >= start:
                current = bps
        return current

    return capacity


@dataclass
class Link:
    capacity: Callable[[float], float]
    base_delay: float = 0.02  # one way, each direction
    max_queue_delay: float = 0.3
    loss: float | Callable[[float], float] = 0.0  # random, after the bottleneck; or by time
    seed: int = 1


@dataclass(frozen=True, slots=True)
class Sample:
    t: float
    target: int
    capacity: float
    queue_delay: float  # the longest a packet sent since the previous sample waited in the queue


@dataclass(slots=True)
class _Queued:
    size: int
    ready: float  # when it may leave
    cluster: int | None = None
    rate: float = 0.0  # a probe packet's rate


@dataclass
class Simulation:
    controller: Controller
    link: Link
    fps: float = 30.0
    feedback_interval: float = 0.05
    process_interval: float = 0.025
    receiver_offset: float = 1000.0  # the receiver's clock origin differs
    sample_interval: float = 0.1
    remb: Sequence[tuple[float, int]] = ()  # (time, bits/s): REMB messages the sender gets
    app_limit: float | None = None  # bits/s: the encoder makes no more (a still picture)
    samples: list[Sample] = field(default_factory=list)
    sent: int = 0
    dropped: int = 0  # by the queue
    lost: int = 0  # at random

    def __post_init__(self) -> None:
        self._rng = random.Random(self.link.seed)
        self._t = 0.0
        self._media: deque[_Queued] = deque()
        self._probe: deque[_Queued] = deque()
        self._pacer_free = 0.0
        self._link_free = 0.0
        self._seq = 0
        self._in_flight: deque[tuple[int, float | None]] = deque()  # (seq, arrival) in order
        self._feedback: deque[tuple[float, list[PacketFeedback]]] = deque()  # (delivery, items)
        self._next_frame = 0.0
        self._next_report = self.feedback_interval
        self._next_process = 0.0
        self._next_sample = 0.0
        self._longest_wait = 0.0
        self._remb = deque(sorted(self.remb))

    def run(self, until: float, tick: float = 0.001) -> None:
        while self._t < until - 1e-9:
            self._t = t = round(self._t + tick, 9)
            while self._feedback and self._feedback[0][0] <= t:
                delivery, items = self._feedback.popleft()
                self.controller.on_feedback(delivery, items)
            while self._remb and self._remb[0][0] <= t:
                self.controller.on_remb(t, self._remb.popleft()[1])
            if t >= self._next_process:
                self.controller.process(t)
                self._next_process += self.process_interval
            if t >= self._next_frame:
                self._encode(self._next_frame)
                self._next_frame += 1 / self.fps
            self._pace(t)
            if t >= self._next_report:
                self._report(t)
                self._next_report += self.feedback_interval
            if t >= self._next_sample:
                self._next_sample += self.sample_interval
                target = self.controller.target_bitrate
                capacity = self.link.capacity(t)
                self.samples.append(Sample(t, target, capacity, self._longest_wait))
                self._longest_wait = 0.0

    def _encode(self, t: float) -> None:
        rate = float(self.controller.target_bitrate)
        if self.app_limit is not None:
            rate = min(rate, self.app_limit)
        remaining = max(int(rate / self.fps / 8), 100)
        while remaining > 0:
            size = min(remaining, PACKET_BYTES)
            self._media.append(_Queued(size, t))
            remaining -= size

    def _pace(self, t: float) -> None:
        if not self._probe:
            cluster = self.controller.next_probe(t)
            if cluster is not None:
                count = max(cluster.min_packets, math.ceil(cluster.min_bytes / PACKET_BYTES))
                for _ in range(count):
                    self._probe.append(_Queued(PACKET_BYTES, t, cluster.id, cluster.bitrate))
        while True:
            queue = self._probe or self._media
            if not queue:
                return
            packet = queue[0]
            send_time = max(self._pacer_free, packet.ready)
            if send_time > t:
                return
            queue.popleft()
            rate = packet.rate if packet.cluster is not None else self.controller.pacing_bitrate
            self._pacer_free = send_time + packet.size * 8 / max(rate, 1.0)
            self._send(packet, send_time)

    def _send(self, packet: _Queued, t: float) -> None:
        self._seq += 1
        self.sent += 1
        self.controller.on_packet_sent(SentPacket(self._seq, packet.size, t, packet.cluster))
        start = max(t, self._link_free)
        if start - t > self.link.max_queue_delay:
            self.dropped += 1
            self._in_flight.append((self._seq, None))
            return
        self._longest_wait = max(self._longest_wait, start - t)
        self._link_free = start + packet.size * 8 / self.link.capacity(start)
        arrival: float | None = self._link_free + self.link.base_delay
        loss = self.link.loss(t) if callable(self.link.loss) else self.link.loss
        if loss and self._rng.random() < loss:
            self.lost += 1
            arrival = None
        self._in_flight.append((self._seq, arrival))

    def _report(self, t: float) -> None:
        """Everything up to the newest packet arrived by `t`; the gaps before it as lost."""
        last = -1
        for i, (_, arrival) in enumerate(self._in_flight):
            if arrival is None:
                continue
            if arrival > t:
                break
            last = i
        if last < 0:
            return
        items = []
        for _ in range(last + 1):
            seq, arrival = self._in_flight.popleft()
            items.append(
                PacketFeedback(seq, None if arrival is None else arrival + self.receiver_offset)
            )
        self._feedback.append((t + self.link.base_delay, items))


# the scenarios the tests assert on, and `python -m tests.congestion_sim` prints


def first_time(
    samples: Sequence[Sample], after: float, condition: Callable[[Sample], bool]
) -> float | None:
    """The first sample time at or after `after` where `condition` holds."""
    for s in samples:
        if s.t >= after and condition(s):
            return s.t
    return None


def run_steady(seconds: float = 20.0, capacity: float = 8e6) -> Simulation:
    controller = CongestionController(1_000_000, 100_000, 20_000_000)
    sim = Simulation(controller, Link(steps((0, capacity))))
    sim.run(seconds)
    return sim


def run_step(down: float = 10.0, up: float = 20.0, seconds: float = 30.0) -> Simulation:
    controller = CongestionController(2_000_000, 100_000, 16_000_000)
    sim = Simulation(controller, Link(steps((0, 20e6), (down, 2e6), (up, 20e6))))
    sim.run(seconds)
    return sim


def run_loss(
    loss: float, seconds: float = 20.0, capacity: float = 8e6, start: float = 0.0
) -> Simulation:
    """`loss` from `start` on."""
    controller = CongestionController(1_000_000, 100_000, 20_000_000)
    lossy = steps((0, 0.0), (start, loss))
    sim = Simulation(controller, Link(steps((0, capacity)), loss=lossy, seed=7))
    sim.run(seconds)
    return sim


def _summary(name: str, sim: Simulation, start: float = 0.0, end: float = math.inf) -> str:
    samples = [s for s in sim.samples if start <= s.t < end]
    targets = [s.target / 1e6 for s in samples]
    waits = sorted(s.queue_delay * 1e3 for s in samples)
    return (
        f"{name}: target mean {sum(targets) / len(targets):.2f} min {min(targets):.2f} "
        f"max {max(targets):.2f} Mbit/s; queue wait p50 {waits[len(waits) // 2]:.0f} "
        f"p95 {waits[int(len(waits) * 0.95)]:.0f} max {waits[-1]:.0f} ms"
    )


def _after(t: float | None, start: float) -> str:
    return "never" if t is None else f"{t - start:.1f} s"


def main() -> None:
    steady = run_steady()
    reach = first_time(steady.samples, 0, lambda s: s.target >= 0.7 * s.capacity)
    print(f"steady 8 Mbit/s, start 1 Mbit/s: >= 70 % of the capacity after {_after(reach, 0)}")
    print(_summary("  5-20 s", steady, 5.0))
    step = run_step()
    before = first_time(step.samples, 0, lambda s: s.target >= 0.8 * 16e6)
    under = first_time(step.samples, 10.0, lambda s: s.target < 2e6)
    back = first_time(step.samples, 20.0, lambda s: s.target >= 0.8 * 16e6)
    print("step 20 -> 2 (at 10 s) -> 20 Mbit/s (at 20 s), max 16 Mbit/s:")
    print(f"  >= 12.8 Mbit/s after {_after(before, 0)} at the start")
    print(f"  under 2 Mbit/s {_after(under, 10)} after the step down")
    print(f"  >= 12.8 Mbit/s {_after(back, 20)} after the step up", end="")
    dips = [s.t for s in step.samples if s.t >= 20.0 and s.target < 0.8 * 16e6]
    print(f", and for good {_after(dips[-1] + step.sample_interval, 20)} after it" if dips else "")
    print(_summary("  12-20 s (2 Mbit/s)", step, 12.0, 20.0))
    print(_summary("  25-30 s (20 Mbit/s)", step, 25.0))
    print(f"  dropped by the queue: {step.dropped} of {step.sent} packets")
    lossy = run_loss(0.02)
    print(_summary("2 % random loss on 8 Mbit/s, 5-20 s", lossy, 5.0))
    lossy = run_loss(0.2, start=5.0)
    print(_summary("20 % loss from 5 s on 8 Mbit/s: 3-5 s", lossy, 3.0, 5.0))
    half = first_time(lossy.samples, 5.0, lambda s: s.target < 0.5 * s.capacity)
    print(f"  under half the capacity {_after(half, 5)} after the loss began")
    print(_summary("  15-20 s", lossy, 15.0))


if __name__ == "__main__":
    main()
