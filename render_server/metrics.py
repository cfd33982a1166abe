"""Prometheus metrics of one server process, on a registry of its own (tests run many apps)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from render_server.gc_pauses import GcPauseCollector
from render_server.loop_lag import LoopLagCollector
from render_server.metrics_merge import Labels, merge_expositions

__all__ = ["CONTENT_TYPE_LATEST", "Metrics", "WorkerStatusGauges"]


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        r.register(GcPauseCollector())
        r.register(LoopLagCollector())
        self.messages = Counter(
            "signaling_messages", "Signaling messages accepted, by type", ["type"], registry=r
        )
        self.rejected = Counter(
            "signaling_rejected",
            "Signaling messages and connections rejected, by error code",
            ["code"],
            registry=r,
        )
        self.connections = Gauge("signaling_connections", "Open signaling sockets", registry=r)
        self.viewers = Gauge(
            "signaling_viewers", "Viewers of shared sessions with a socket here", registry=r
        )
        self.shares = Counter("signaling_shares", "Share links minted (session.share)", registry=r)
        self.watches = Counter(
            "signaling_watch",
            "Watch requests (session.watch), by outcome: watching, unauthorized (no, bad or "
            "expired link), forbidden (a token of another session), unknown_session",
            ["outcome"],
            registry=r,
        )
        self.scene_uploads = Counter(
            "signaling_scene_uploads",
            "Scene uploads (POST /api/scenes), by outcome: stored, too_large, refused (not a "
            "model, or a broken or unsafe one), unsupported_type, over_quota, too_many_scenes, "
            "busy (too many of the owner's at once), broken (the body broke off or stalled), "
            "unavailable (the scene folder did not answer)",
            ["outcome"],
            registry=r,
        )
        self.sessions_started = Counter("sessions_started", "Sessions started", registry=r)
        self.claims = Counter("scheduler_claims", "Slots claimed at once for a session", registry=r)
        self.queued = Counter(
            "scheduler_queued", "Sessions that had to wait in the queue", registry=r
        )
        self.queue_length = Gauge("scheduler_queue_length", "Sessions waiting now", registry=r)
        self.workers = Gauge("scheduler_workers", "Workers registered", registry=r)
        self.sessions_ended = Counter(
            "sessions_ended", "Sessions ended, by reason", ["reason"], registry=r
        )
        self.sessions_moved = Counter(
            "sessions_moved", "Sessions moved to another worker (a drain)", registry=r
        )
        self.sessions_active = Gauge("sessions_active", "Sessions in progress", registry=r)
        self.slots_total = Gauge("worker_slots", "Worker slots registered", registry=r)
        self.slots_free = Gauge("worker_slots_free", "Worker slots free", registry=r)
        self.frames = Counter("worker_frames_encoded", "Frames encoded and sent", registry=r)
        self.frame_bytes = Counter("worker_frame_bytes", "Encoded bytes sent", registry=r)
        self.frames_untimed = Counter(
            "worker_frames_untimed",
            "Frames sent without a timing record: the encoder handed back another frame",
            registry=r,
        )
        self.session_pauses = Counter(
            "worker_session_pauses",
            "Times a session stopped making frames: its peer sent no RTCP for 3 s, no viewer",
            registry=r,
        )
        self.keyframes = Counter(
            "worker_keyframes", "Keyframes encoded, by reason", ["reason"], registry=r
        )
        self.retransmissions = Counter(
            "worker_rtp_retransmissions",
            "Packets NACKed by browsers: resent from the history, or missing from it",
            ["result"],
            registry=r,
        )
        self.remb = Counter(
            "worker_remb", "Receiver bitrate estimates (REMB) passed to encoders", registry=r
        )
        self.encoder_bitrate = Gauge(
            "worker_encoder_bitrate_bps", "Bitrate the encoders aim at, summed", registry=r
        )
        self.input_events = Counter(
            "worker_input_events", "Input events applied, by type", ["type"], registry=r
        )
        self.input_rejected = Counter(
            "worker_input_rejected", "Input messages rejected, by error code", ["code"], registry=r
        )
        self.scene_loads = Counter(
            "worker_scene_loads",
            "Uploaded scenes a session asked for (loadScene), by outcome: loaded, refused "
            "(the ticket or the file), failed (could not be fetched)",
            ["outcome"],
            registry=r,
        )

        self.frame_stage_seconds = Histogram(
            "worker_frame_stage_seconds",
            "Time per frame in each worker stage: wait (input → frame start), render (with "
            "colour conversion), encode, handoff (to aiortc), send (to the last RTP packet)",
            ["stage"],
            buckets=(0.0005, 0.001, 0.002, 0.004, 0.008, 0.012, 0.016, 0.025, 0.033, 0.05,
                     0.075, 0.1, 0.2, 0.5),
            registry=r,
        )  # fmt: skip

        # per session (the label is the session id's first 12 hex digits; removed at its end)
        self.session_cpu = Gauge(
            "worker_session_cpu_seconds",
            "CPU time of the session's frame thread (render, convert, encode); a replayed clip "
            "is sent from the event loop and has none",
            ["session"],
            registry=r,
        )
        self.session_fps = Gauge(
            "worker_session_fps", "Frame rate the session sends at now", ["session"], registry=r
        )
        self.session_send_ms = Gauge(
            "worker_session_send_ms",
            "Mean time from a frame's hand-off to aiortc to its last RTP packet on the wire, "
            "over the last second: the send queue's delay",
            ["session"],
            registry=r,
        )
        self.session_dropped = Gauge(
            "worker_session_dropped_ticks",
            "Frame times the session skipped because a frame took too long",
            ["session"],
            registry=r,
        )
        self.transport_feedback = Counter(
            "worker_transport_feedback",
            "Transport-cc feedback messages from browsers read by the congestion controller",
            registry=r,
        )
        self.paced_packets = Counter(
            "worker_paced_packets",
            "RTP packets the paced send path sent, by kind: media, rtx (NACKed packets resent on "
            "the RTX stream), retransmission (resent on the media stream), padding (probes), "
            "fec (ULPFEC packets, first sent or resent for a NACK)",
            ["kind"],
            registry=r,
        )
        self.bandwidth_steps = Counter(
            "worker_bandwidth_steps",
            "Times a session's stream stepped its size or frame rate down (or back up) because "
            "the congestion controller's target stayed too low for it (or recovered)",
            ["direction"],
            registry=r,
        )
        self.overload_steps = Counter(
            "worker_overload_steps",
            "Times a session lowered its frame rate because the worker could not keep up",
            registry=r,
        )

        self.viewers_connected = Gauge(
            "worker_viewers", "Viewers of shared sessions connected now", registry=r
        )
        self.viewers_removed = Counter(
            "worker_viewers_removed", "Viewers their session's owner removed", registry=r
        )
        self.viewer_joins = Counter(
            "worker_viewer_joins",
            "Viewers' offers, by outcome: answered, too_many_viewers, sharing_off, bad_offer, "
            "session_ended (the session was ending)",
            ["outcome"],
            registry=r,
        )
        self.viewer_frames = Counter(
            "worker_viewer_frames",
            "Frames to viewers, by outcome: sent (the same encoded frame as the owner's), "
            "dropped (a viewer that did not keep up: until the next keyframe)",
            ["outcome"],
            registry=r,
        )
        self.pipeline_failures = Counter(
            "worker_pipeline_failures",
            "Frames that failed in a session's pipeline (encoder, renderer, scene edit); the "
            "first is rebuilt, a second within 10 s ends the session",
            registry=r,
        )
        self._worker_status: WorkerStatusGauges | None = None
        # a worker pool's children (`--processes`): index → (pid, its latest /metrics text)
        self.children: dict[int, tuple[int, bytes]] = {}

    def worker_status(self) -> WorkerStatusGauges:
        """A worker process's own gauges (its status port), on this registry; made once."""
        if self._worker_status is None:
            self._worker_status = WorkerStatusGauges(self.registry)
        return self._worker_status

    def render(self) -> bytes:
        own = generate_latest(self.registry)
        if not self.children:
            return own
        labelled: dict[Labels, bytes] = {
            (("child", str(index)), ("child_pid", str(pid))): text
            for index, (pid, text) in sorted(self.children.items())
        }
        return merge_expositions(own, labelled)


class WorkerStatusGauges:
    """What a worker process says of itself on its status port (`--metrics-port`)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.draining = Gauge(
            "render_worker_draining", "1 while the worker drains (hands its sessions over)",
            registry=r,
        )  # fmt: skip
        self.sessions = Gauge("render_worker_sessions", "Sessions the worker serves", registry=r)
        self.signaling_connected = Gauge(
            "render_worker_signaling_connected",
            "1 while the worker is registered with a signaling replica",
            registry=r,
        )
        self.registrations = Counter(
            "render_worker_signaling_registrations",
            "Registrations with a signaling replica (the first, and each after a lost one)",
            registry=r,
        )
