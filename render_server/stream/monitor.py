"""A session's figures: per frame, every tenth of a second, and every second.

- Each frame handed to aiortc: its stage times into /metrics' histograms, the frame, byte and
  keyframe counters, the encoders' bitrate gauge, and its timing record (`transport.timing`).
- Every `TIMING_INTERVAL_S` (a quarter second): the records whose last packet has left, to the
  page in batches.
- Every second: the session's gauges (its frame thread's CPU time, send time, dropped ticks,
  frame rate), and the frame-rate governor's verdict, applied and told to the page.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from render_server.encode.protocol import EncodedPacket
from render_server.logs import SessionLogger
from render_server.metrics import Metrics
from render_server.render.camera import OrbitCamera
from render_server.stream.governor import FrameRateGovernor, SecondOfFrames
from render_server.stream.input_channel import InputChannel
from render_server.stream.pipeline import FramePipeline, FrameTiming
from render_server.ticks import sleep_on_grid
from render_server.transport.timing import FrameRecord, FrameTimingLog
from render_server.transport.track import EncodedVideoTrack

TIMING_INTERVAL_S = 0.25  # a message each costs the worker ~0.2 ms of SCTP and DTLS in Python
TIMING_BATCH = 24  # records per message: well under the data channel's message size
STAGES = ("wait", "render", "encode", "handoff", "send")


class SessionMonitor:
    """Counts a session's frames and runs its two periodic tasks (`start`, `stop`).

    `current_track` gives the current peer's track (None between peers), `set_fps` applies the
    governor's frame rate; messages go to the page through `channel`.
    """

    def __init__(
        self,
        session_id: str,
        log: SessionLogger,
        metrics: Metrics,
        pipeline: FramePipeline,
        channel: InputChannel,
        fps: float,
        current_track: Callable[[], EncodedVideoTrack[OrbitCamera] | None],
        set_fps: Callable[[float], None],
        on_second: Callable[[], None] | None = None,
    ) -> None:
        self.log = log
        self.metrics = metrics
        self.pipeline = pipeline
        self.channel = channel
        self.governor = FrameRateGovernor(fps)
        self.timing = FrameTimingLog()
        self.frames = 0
        self.untimed = 0  # frames handed with no timing record: not the frame just rendered
        self.dropped_ticks = 0  # by the tracks of earlier peers
        self._current_track = current_track
        self._set_fps = set_fps
        self._on_second = on_second
        self._label = session_id[:12]
        # looked up once: every frame observes four of them
        self._stages = {stage: metrics.frame_stage_seconds.labels(stage) for stage in STAGES}
        self._busy_s = 0.0  # frame production time (start → hand-off), for the governor
        self._send_ms: list[float] = []  # hand-off → last packet sent, this second
        self._reported_bitrate = 0  # this session's share of the encoders' bitrate gauge
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._send_timing()), loop.create_task(self._govern())]

    def stop(self) -> None:
        """Stop both tasks (the per-second one then takes its gauges off /metrics) and take
        this session's bitrate off the gauge."""
        for task in self._tasks:
            task.cancel()
        self.metrics.encoder_bitrate.dec(self._reported_bitrate)
        self._reported_bitrate = 0

    def new_peer(self) -> FrameTimingLog:
        """A new peer's sender has a new RTP timestamp origin: a new timing log."""
        self.timing = FrameTimingLog()
        return self.timing

    def peer_gone(self, track: EncodedVideoTrack[OrbitCamera]) -> None:
        self.dropped_ticks += track.dropped_ticks

    def frame_handed(
        self, packet: EncodedPacket, handed_ms: float, shows_input: tuple[int, float | None]
    ) -> None:
        """The pipeline's last frame went to aiortc at `handed_ms`, the first to show the
        input `shows_input` (sequence number, arrival ms)."""
        last = self.pipeline.last
        self._busy_s += (handed_ms - last.start_ms) / 1e3
        if packet.pts is not None and packet.pts != last.pts:
            self._untimed(packet.pts, last.pts)
        else:
            self._timed(packet, last, handed_ms, shows_input)
        self.frames += 1
        self.metrics.frames.inc()
        self.metrics.frame_bytes.inc(packet.size)
        if last.bitrate != self._reported_bitrate:
            self.metrics.encoder_bitrate.inc(last.bitrate - self._reported_bitrate)
            self._reported_bitrate = last.bitrate
        if last.keyframe:
            self.metrics.keyframes.labels("start" if self.frames == 1 else "request").inc()

    def _timed(
        self,
        packet: EncodedPacket,
        last: FrameTiming,
        handed_ms: float,
        shows_input: tuple[int, float | None],
    ) -> None:
        seq, input_ms = shows_input
        self.timing.handed(
            FrameRecord(
                pts=int(packet.pts or 0), seq=seq, input_ms=input_ms, start_ms=last.start_ms,
                rendered_ms=last.rendered_ms, encoded_ms=last.encoded_ms, handed_ms=handed_ms,
                bytes=packet.size, keyframe=last.keyframe,
            )
        )  # fmt: skip
        stages = self._stages
        stages["render"].observe((last.rendered_ms - last.start_ms) / 1e3)
        stages["encode"].observe((last.encoded_ms - last.rendered_ms) / 1e3)
        stages["handoff"].observe((handed_ms - last.encoded_ms) / 1e3)
        if input_ms is not None:
            stages["wait"].observe((last.start_ms - input_ms) / 1e3)

    def _untimed(self, pts: int, given_pts: int) -> None:
        """An encoder that hands back an earlier frame's packet (a lookahead, a lag) would have
        the page match that frame with this frame's render times and input: no record is sent,
        and the page counts the frame as unmatched instead of showing a latency too short."""
        self.untimed += 1
        self.metrics.frames_untimed.inc()
        if self.untimed == 1:
            self.log.warning(
                "session.frame_untimed",
                extra={"pts": pts, "given_pts": given_pts, "reason": "not the frame given"},
            )

    async def _send_timing(self) -> None:
        """The frames' timing records, batched: one small message every TIMING_INTERVAL_S."""
        while True:
            await sleep_on_grid(TIMING_INTERVAL_S)  # with every other session's (`ticks`)
            records = self.timing.drain()
            if not records:
                continue
            for record in records:
                self._stages["send"].observe((record.sent_ms - record.handed_ms) / 1e3)
                self._send_ms.append(record.sent_ms - record.handed_ms)
            for start in range(0, len(records), TIMING_BATCH):
                batch = records[start : start + TIMING_BATCH]
                self.channel.send({"type": "timing", "frames": [r.row() for r in batch]})

    async def _govern(self) -> None:
        """Once a second: per-session figures to /metrics, and fewer frames when overloaded."""
        m, label = self.metrics, self._label
        seen = (0, 0, 0.0, 0)  # ticks, dropped, busy, frames of the current track
        track_seen: EncodedVideoTrack[OrbitCamera] | None = None
        try:
            while True:
                await sleep_on_grid(1.0)
                track = self._current_track()
                cpu = self.pipeline.cpu_seconds()
                if cpu is not None:
                    m.session_cpu.labels(label).set(cpu)
                sends, self._send_ms = self._send_ms, []
                m.session_send_ms.labels(label).set(sum(sends) / len(sends) if sends else 0.0)
                if self._on_second is not None:
                    self._on_second()
                if track is None:
                    continue
                if track is not track_seen:
                    track_seen, seen = track, (0, 0, self._busy_s, self.frames)
                now = (track.ticks, track.dropped_ticks, self._busy_s, self.frames)
                second = SecondOfFrames(
                    ticks=now[0] - seen[0] + now[1] - seen[1], dropped=now[1] - seen[1],
                    busy_s=now[2] - seen[2], frames=now[3] - seen[3],
                )  # fmt: skip
                seen = now
                m.session_dropped.labels(label).set(self.dropped_ticks + track.dropped_ticks)
                before = self.governor.fps
                fps = self.governor.observe(second)
                if fps is not None:
                    self._apply_governed_fps(fps, lowered=fps < before)
                m.session_fps.labels(label).set(self.governor.fps)
        finally:
            for gauge in (m.session_cpu, m.session_fps, m.session_send_ms, m.session_dropped):
                with contextlib.suppress(KeyError):
                    gauge.remove(label)

    def _apply_governed_fps(self, fps: float, lowered: bool) -> None:
        self._set_fps(fps)
        if lowered:
            self.metrics.overload_steps.inc()
        self.log.warning(
            "session.overload" if lowered else "session.recovered",
            extra={"fps": fps, "wanted_fps": self.governor.wanted_fps},
        )
        self.channel.announce_quality(fps=fps, overloaded=fps < self.governor.wanted_fps)
