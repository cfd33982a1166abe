"""The server under test, over its REST API: which worker mode runs, what `/metrics` counted."""

from __future__ import annotations

import math
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from render_server.protocol.errors import ProtocolError
from render_server.protocol.json_reader import JsonLimits, read_json

# `GET /api/workers`: each worker's capabilities are at most 8 KiB; a fleet of a few hundred
# workers fits with room to spare, and a server that answers gigabytes does not exhaust the harness
WORKERS_JSON = JsonLimits(max_bytes=16 << 20, max_depth=32, max_items=1 << 20)

LATE_TIMER_S = 0.05  # a bucket bound of python_event_loop_lag_seconds
WORKER_COUNTERS = {
    "frames": "worker_frames_encoded_total",
    "bytes": "worker_frame_bytes_total",
    "keyframes": "worker_keyframes_total",
    "sessions_started": "sessions_started_total",
    "transport_feedback": "worker_transport_feedback_total",  # read by the controllers
    "loop_timers": "python_event_loop_lag_seconds_count",
    # sessions the worker stopped because their client sent no RTCP for 3 s (`quiet_peer`): a
    # harness too busy to report is a client gone quiet, and its streams stop
    "session_pauses": "worker_session_pauses_total",
}
LABELLED = {
    # RTP packets of media the paced send path sent first (not resent, not padding or FEC)
    "media_packets": ("worker_paced_packets_total{", 'kind="media"'),
    # the server's full garbage collections (each stops every stream of its process), and
    # their time, summed over a worker pool's children
    "full_collections": ("python_gc_pause_seconds_count{", 'generation="2"'),
    "full_collection_s": ("python_gc_pause_seconds_sum{", 'generation="2"'),
    # timers the server's event loops ran at most LATE_TIMER_S late (render_server/loop_lag.py)
    "loop_timers_prompt": ("python_event_loop_lag_seconds_bucket{", f'le="{LATE_TIMER_S:g}"'),
}


class ServerUnreachable(ConnectionError):
    """The server did not answer, or not as a render server does."""


@dataclass(frozen=True)
class ServerApi:
    url: str  # http(s)://host:port
    token: str | None = None
    timeout_s: float = 5.0

    def _request(self, path: str, method: str = "GET") -> urllib.request.Request:
        request = urllib.request.Request(self.url.rstrip("/") + path, method=method)
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        return request

    def _get(self, path: str) -> bytes:
        try:
            with urllib.request.urlopen(self._request(path), timeout=self.timeout_s) as response:
                data: bytes = response.read()
                return data
        except urllib.error.HTTPError as exc:
            raise ServerUnreachable(f"{self.url}{path} answered HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ServerUnreachable(f"cannot reach {self.url}: {reason}") from None

    def workers(self) -> list[dict[str, Any]]:
        """`GET /api/workers`: the registered workers with their capabilities."""
        try:
            doc = read_json(self._get("/api/workers"), WORKERS_JSON)
        except ProtocolError:
            raise ServerUnreachable(f"{self.url}/api/workers is not a render server's") from None
        workers = doc.get("workers") if isinstance(doc, dict) else None
        if not isinstance(workers, list):
            raise ServerUnreachable(f"{self.url}/api/workers is not a render server's")
        return workers

    def metrics(self) -> dict[str, float]:
        """`GET /metrics`, the worker counters summed over their labels."""
        return worker_counters(self._get("/metrics").decode())

    def end_session(self, session_id: str) -> int:
        """`DELETE /api/sessions/{id}`; the HTTP status."""
        request = self._request(f"/api/sessions/{session_id}", method="DELETE")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)


def parse_prometheus(text: str) -> dict[str, float]:
    """Prometheus text exposition → {"name{labels}": value} (comments and NaN skipped)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, rest = line.rpartition(" ")
        if not name:
            continue
        try:
            value = float(rest)
        except ValueError:
            continue
        if not math.isnan(value):
            out[name.strip()] = value
    return out


def worker_counters(text: str) -> dict[str, float]:
    """The counters the report sets beside its own totals, each summed over its labels."""
    samples = parse_prometheus(text)
    out = {}
    for key, metric in WORKER_COUNTERS.items():
        out[key] = sum(
            value
            for name, value in samples.items()
            if name == metric or name.startswith(metric + "{")
        )
    for key, (prefix, label) in LABELLED.items():
        out[key] = sum(
            value for name, value in samples.items() if name.startswith(prefix) and label in name
        )
    return out


def worker_mode(workers: list[dict[str, Any]]) -> dict[str, Any]:
    """What the workers stream with: `replay` (the packet path alone) or a real encoder."""
    encoders = sorted({str(w.get("capabilities", {}).get("encoder")) for w in workers})
    renderers = sorted({str(w.get("capabilities", {}).get("renderer")) for w in workers})
    return {
        "workers": len(workers),
        "slots": sum(int(w.get("slots") or 0) for w in workers),
        "free_slots": sum(int(w.get("free") or 0) for w in workers),
        "encoders": encoders,
        "renderers": renderers,
        "replay": encoders == ["replay"],
        "description": (
            "replay: a pre-encoded clip in a loop, so this run measured the packet path "
            "(signaling, WebRTC transport, this harness), not rendering or encoding"
            if encoders == ["replay"]
            else f"real frames: renderer {'/'.join(renderers)}, encoder {'/'.join(encoders)}"
        ),
        "capabilities": [w.get("capabilities", {}) for w in workers],
    }


def server_check(
    before: dict[str, float],
    after: dict[str, float] | None,
    error: str | None,
    frames: int,
    sent: int,
    packets: int,
) -> dict[str, Any]:
    """The worker's own counters over the run (after − before) beside the harness's totals.
    The worker counts encoded bytes; the harness counts RTP payload bytes (no start codes,
    with FU-A/STAP-A headers), which differ by a few bytes per NAL unit and packet."""
    if after is None:
        return {"error": error}
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    return {
        "server_frames": int(delta["frames"]),
        "server_bytes": int(delta["bytes"]),
        "server_keyframes": int(delta["keyframes"]),
        "server_sessions_started": int(delta["sessions_started"]),
        "server_session_pauses": int(delta["session_pauses"]),
        "server_media_packets": int(delta.get("media_packets", 0.0)),
        "server_transport_feedback": int(delta.get("transport_feedback", 0.0)),
        "server_full_collections": int(delta.get("full_collections", 0.0)),
        "server_full_collection_ms": round(delta.get("full_collection_s", 0.0) * 1000, 1),
        # every server process's loop (a pool's parent and children), timers sampled 20 a second
        "server_late_timers": int(
            delta.get("loop_timers", 0.0) - delta.get("loop_timers_prompt", 0.0)
        ),
        "harness_frames": frames,
        "harness_bytes": sent,
        "harness_packets": packets,
        "frames_ratio": round(frames / delta["frames"], 4) if delta["frames"] else None,
        "bytes_ratio": round(sent / delta["bytes"], 4) if delta["bytes"] else None,
        "packets_ratio": (
            round(packets / delta["media_packets"], 4) if delta.get("media_packets") else None
        ),
        "note": "counters are deltas over the run: other clients of the server would count too",
    }
