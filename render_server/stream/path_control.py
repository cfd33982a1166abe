"""A session's side of congestion control: the paced send path of each peer, the bandwidth
steps the path's target calls for, and the path's figures for the page and /metrics.

The session owns the peer connection; this object starts a `SendPath` on its video sender
(transport/send_path.py: pacer, transport-cc congestion controller, FEC), feeds it REMB and
the stream's bitrate ceiling, and once a second applies the bandwidth step
(stream/bandwidth_steps.py) and tells the page (`network`). `--record-congestion` writes
each peer's controller inputs for replay tests.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import IO, Any, Final

from render_server.config import Resolution
from render_server.logs import SessionLogger
from render_server.metrics import Metrics
from render_server.stream.bandwidth_steps import BandwidthSteps
from render_server.stream.input_channel import InputChannel
from render_server.stream.pipeline import FramePipeline
from render_server.transport.congestion import CongestionController
from render_server.transport.congestion.record import ControllerRecorder, open_recording
from render_server.transport.paced_negotiation import fec_payload_types
from render_server.transport.send_path import ESTIMATE_HEADROOM, SendPath

# where the congestion controller starts before the first feedback: its first probes (3x and
# 6x) reach a 720p30 stream's bitrate in a round trip or two, without flooding a thin path
START_BITRATE: Final = 1_000_000
MIN_BITRATE: Final = 100_000
# a browser sends RTCP (transport feedback, receiver reports) several times a second: this
# long without any, its path is gone, whatever ICE says yet
PEER_SILENT_S: Final = 10.0


class PathControl:
    """The paced send path of a session's current peer (`path`, None between peers)."""

    def __init__(
        self,
        session_id: str,
        log: SessionLogger,
        metrics: Metrics,
        pipeline: FramePipeline,
        channel: InputChannel,
        nacks: dict[bool, int],
        record_dir: str | None = None,
    ) -> None:
        self.session_id = session_id
        self.log = log
        self.metrics = metrics
        self.pipeline = pipeline
        self.channel = channel
        self.nacks = nacks  # the session's NACKed packets: resent (True), missing (False)
        self.steps = BandwidthSteps(self._bitrate_for)
        self.path: SendPath | None = None
        self._record_dir = record_dir
        self._recording: IO[str] | None = None
        self._feedback_counted = 0  # the path's feedback messages already on /metrics
        self.on_peer_silent: Callable[[], None] | None = None  # no RTCP for PEER_SILENT_S

    def start(self, sender: Any, peer: int) -> SendPath:
        """Pace `sender` (after the offer is applied and the timing records' hook is on)."""
        most = self.max_bitrate()
        controller = CongestionController(
            start_bitrate=min(most, START_BITRATE), min_bitrate=min(most, MIN_BITRATE),
            max_bitrate=most * ESTIMATE_HEADROOM,
        )  # fmt: skip
        recorded: CongestionController | ControllerRecorder = controller
        if self._record_dir is not None:
            name = f"{self.session_id}-{peer}.jsonl.gz"
            self._recording = open_recording(os.path.join(self._record_dir, name), "w")
            recorded = ControllerRecorder(controller, self._recording)
        self.path = SendPath(sender, recorded, on_target=self.pipeline.request_bitrate)
        self._feedback_counted = 0
        self.path.install(most)
        self.steps.reset()
        self.channel.set_step(self.steps.step)
        return self.path

    def answered(self, answer_sdp: str, fec_copies: bool = True) -> bool:
        """The answer is set: forward error correction where it has RED and ULPFEC (FEC packets
        sent twice with `fec_copies`, see transport/fec_path.py)."""
        fec = fec_payload_types(answer_sdp) if self.path is not None else None
        if fec is not None and self.path is not None:
            self.path.enable_fec(fec, fec_copies)
        return fec is not None

    def on_remb(self, bitrate: int) -> bool:
        """REMB: a cap for the controller; False where there is no paced path to take it."""
        if self.path is None:
            return False
        self.path.on_remb(bitrate)
        return True

    async def stop(self) -> None:
        """The peer is gone: its path stops, its figures are counted and logged."""
        path, self.path = self.path, None
        if path is None:
            return
        await path.stop()
        self._count_packets(path)
        if self._recording is not None:
            self._recording.close()
            self._recording = None
        state, fec = path.state(), path.fec
        self.log.info(
            "session.send_path",
            extra={"mode": state["mode"], "target": state["target"],
                   "feedback": path.feedback_messages, "probes": path.prober.started,
                   "step": self.steps.index, "loss": round(state["loss"], 4),
                   "fec_sent": fec.fec_sent if fec else None,
                   "fec_resent": fec.fec_resent if fec else None,
                   "fec_withheld": fec.rekey.withheld if fec and fec.rekey else None,
                   "media_copies": fec.media_copies if fec else None,
                   "resend_copies": fec.resend_copies if fec else None,
                   "fec_holes": fec.holes.refilled if fec and fec.holes else None,
                   "segmented": path.output.segmented if path.output else None},
        )  # fmt: skip

    def max_bitrate(self) -> int:
        """The most the stream may spend: the page's cap or its size and rate's bitrate (the
        size and rate the page asked, not a bandwidth step's: the estimate must be able to
        climb back to them)."""
        quality = self.channel.quality
        return min(quality.max_kbps, self.channel.quality_limits.stream_kbps(quality)) * 1000

    def each_second(self) -> None:
        """The path's figures to the page, and the bandwidth step the target calls for."""
        path = self.path
        if path is None:
            return
        self._count_packets(path)
        heard = path.last_rtcp
        if heard is not None and time.monotonic() - heard > PEER_SILENT_S:
            path.last_rtcp = None  # told once
            if self.on_peer_silent is not None:
                self.on_peer_silent()
        most = self.max_bitrate()
        if most != path.max_bitrate:
            path.set_max_bitrate(most)
        quality = self.channel.quality
        before = self.steps.index
        # on REMB alone (no transport feedback) the stream is left at its size, as before
        step = (
            self.steps.observe(time.monotonic(), path.target, quality.resolution, quality.fps)
            if path.mode == "transport-cc"
            else None
        )
        if step is not None:
            self.channel.set_step(step)
            size, fps = self.channel.sent_format()
            self.metrics.bandwidth_steps.labels("down" if self.steps.index > before else "up").inc()
            self.log.info(
                "session.bandwidth_step",
                extra={"step": self.steps.index, "size": str(size), "fps": fps,
                       "target": path.target},
            )  # fmt: skip
        self.channel.send(self._figures(path))

    def _figures(self, path: SendPath) -> dict[str, Any]:
        size, fps = self.channel.sent_format()
        state = path.state()
        return {
            "type": "network", "mode": state["mode"],
            "estimateKbps": state["estimate"] // 1000, "targetKbps": path.target // 1000,
            "pacingKbps": state["pacing"] // 1000, "lossPercent": round(state["loss"] * 100, 2),
            "rttMs": None if state["rtt"] is None else round(state["rtt"] * 1e3, 1),
            "queueMs": state["queue_ms"], "pathQueueMs": round(state["path_queue"] * 1e3, 1),
            "probing": state["probing"], "step": self.steps.index,
            "width": size.width, "height": size.height, "fps": fps,
            "resent": self.nacks[True], "resendMissing": self.nacks[False],
        }  # fmt: skip

    def _count_packets(self, path: SendPath) -> None:
        """The path's packets and feedback since the last count, onto /metrics (once a
        second, not each)."""
        for kind, count in path.packets.items():
            self.metrics.paced_packets.labels(kind).inc(count)
        path.packets.clear()
        self.metrics.transport_feedback.inc(path.feedback_messages - self._feedback_counted)
        self._feedback_counted = path.feedback_messages

    def _bitrate_for(self, resolution: Resolution, fps: float) -> int:
        stream = self.channel.quality_limits.stream
        if stream is None:
            return self.channel.quality_limits.max_kbps * 1000
        return stream.bitrate_for(resolution, fps)
