"""What one load-test stream saw (`StreamResult`), filled by its `stream.StreamProbe` and read
by the report."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class StreamResult:
    """What one stream saw. Times `*_s` are seconds since the run's start (every process's
    shared origin); series are per second of the run, index = whole seconds since the start."""

    index: int
    process: int
    state: str = "pending"  # pending, connecting, queued, negotiating, up, closing, closed, failed
    reason: str | None = None  # why it failed
    session_id: str | None = None
    worker_id: str | None = None
    requested_s: float | None = None
    first_frame_s: float | None = None
    ended_s: float | None = None
    queued_position: int | None = None
    quality_requested: dict[str, Any] = field(default_factory=dict)
    quality_applied: dict[str, Any] | None = None
    # the size the session started at (session.started), before our quality request applied:
    # its first keyframe may be of that size
    started_size: str | None = None
    frames: int = 0
    bytes: int = 0  # RTP payload bytes of the frames assembled
    keyframes: int = 0
    incomplete_frames: int = 0
    packets: int = 0
    # packets not counted as media: repeats and RTX probe padding (copies), and packets of
    # frames already done or given up
    duplicate_packets: int = 0
    lost_packets: int = 0  # missing when their frame was given up (after NACK repair)
    socket_packets: int = 0  # lean: SRTP datagrams read where the socket received them
    socket_reads: int = 0  # lean: the reads that brought every datagram (UDP_GRO: runs whole)
    socket_stamped: int = 0  # of them, those timed by the kernel's receive time (udp_gro)
    socket_dropped: int = 0  # the kernel's drops at the harness's full sockets (a run: once)
    feedback_sent: int = 0  # transport-cc feedback packets (`transport_feedback`)
    nacks_sent: int = 0
    nacked_packets: int = 0
    plis_sent: int = 0
    freezes: int = 0
    freeze_ms: float = 0.0
    freeze_events: list[tuple[float, float]] = field(default_factory=list)  # (ended at s, ms)
    longest_gap_ms: float = 0.0
    frames_per_s: list[int] = field(default_factory=list)
    bytes_per_s: list[int] = field(default_factory=list)
    frame_t_s: list[float] = field(default_factory=list)  # every frame's arrival (not in JSON)
    latency_t_s: list[float] = field(default_factory=list)  # frame arrival, per matched frame
    latency_ms: list[float] = field(default_factory=list)  # frame start → last packet in
    timing_records: int = 0
    bad_timing: int = 0
    clock: dict[str, float | bool] | None = None
    decode: dict[str, Any] | None = None
    worker_errors: list[dict[str, Any]] = field(default_factory=list)

    @property
    def setup_ms(self) -> float | None:
        if self.requested_s is None or self.first_frame_s is None:
            return None
        return (self.first_frame_s - self.requested_s) * 1000.0
