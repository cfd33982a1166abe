"""A session's frames stop while its peer is quiet: no RTCP for PEER_QUIET_S (a browser reports
at least every 1.5 s while its peer lives) means nobody sees them: a crashed or frozen browser,
a laptop lid closed, a path that died. The session makes none until RTCP comes again, unless
viewers watch, and starts again with a keyframe (what was in flight when it went quiet is
lost); the peer is still let go after PEER_SILENT_S (path_control)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final, Protocol

from aiortc import RTCRtpSender

from render_server.logs import SessionLogger
from render_server.metrics import Metrics
from render_server.transport.fan_out import watch_rtcp
from render_server.transport.send_path import SendPath

PEER_QUIET_S: Final = 3.0


class Pausable(Protocol):
    @property
    def paused(self) -> bool: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...


class QuietPeerPause:
    """When the peer's RTCP last came (`heard`, from its sender's RTCP hook, and the send
    path's transport feedback), and the track paused or resumed each second (`check`)."""

    def __init__(
        self, log: SessionLogger, metrics: Metrics, request_keyframe: Callable[[], None]
    ) -> None:
        self.log = log
        self.metrics = metrics
        self.request_keyframe = request_keyframe
        self.heard_at: float | None = None  # the peer's last RTCP (or its connection's start)
        self._paused_at = 0.0

    def new_peer(self, sender: RTCRtpSender) -> None:
        """A new peer connection: its RTCP is what tells."""
        self.heard_at = None
        watch_rtcp(sender, self.heard)

    def connected(self) -> None:
        self.heard_at = self.heard_at or time.monotonic()

    def heard(self) -> None:
        self.heard_at = time.monotonic()

    def check(self, track: Pausable | None, path: SendPath | None, watched: bool) -> None:
        """Pause `track` while the peer is quiet and nobody `watched`; resume it otherwise."""
        now, heard = time.monotonic(), self.heard_at
        if track is None or heard is None:
            return
        if path is not None and path.last_rtcp is not None:
            heard = max(heard, path.last_rtcp)  # transport feedback, many times a second
        quiet = now - heard > PEER_QUIET_S and not watched
        if quiet and not track.paused:
            track.pause()
            self._paused_at = now
            self.metrics.session_pauses.inc()
            self.log.info("session.paused", extra={"quiet_s": round(now - heard, 1)})
        elif not quiet and track.paused:
            self.request_keyframe()
            track.resume()
            self.log.info("session.resumed", extra={"paused_s": round(now - self._paused_at, 1)})
