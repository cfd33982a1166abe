"""`render-server worker`: a worker process that registers with a signaling server over a
WebSocket, sends heartbeats and serves the sessions placed on it.

It fails over between signaling replicas (worker/signaling_links.py). Its sessions outlive a
lost signaling connection: their media goes peer to peer. A registration (and each heartbeat)
says which sessions the worker serves, so the replica it reaches next takes them back; a
`session.ended` that could not be sent meanwhile is sent after the next registration. It drains
(worker/drain.py) on `stop`'s first signal, on `worker.drain` or on a spot notice, and leaves
with `worker.leaving` once drained or at the drain's deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine, Sequence
from typing import Any, Final

import aiohttp

from render_server.config import DRAIN_TIMEOUT_S, HEARTBEAT_S
from render_server.protocol.errors import ProtocolError
from render_server.protocol.json_reader import read_json
from render_server.protocol.wire import (
    RELAYED_JSON,
    RELAYED_MESSAGE_BYTES,
    SUBPROTOCOL,
    check_document,
    encode_message,
    parse_document,
)
from render_server.protocol.worker import (
    TO_WORKER,
    FromWorker,
    Registered,
    WorkerLeaving,
    WorkerSessionEnded,
)
from render_server.worker.drain import Drain
from render_server.worker.local import LocalWorker
from render_server.worker.pool import worker_service
from render_server.worker.pool_children import WorkerPool
from render_server.worker.signaling_links import (
    BACKOFF_MAX_S,
    BACKOFF_START_S,
    Jitter,
    SignalingLinks,
    full_jitter,
)

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S: Final = 10.0  # TCP, TLS and the WebSocket handshake of one attempt
MAX_UNSENT_ENDED: Final = 1024  # `session.ended` kept for the next registration
NETWORK_ERRORS: Final = (TimeoutError, aiohttp.ClientError, OSError, RuntimeError)


class WorkerAgent:
    def __init__(
        self,
        worker: LocalWorker,
        signaling_urls: str | Sequence[str],
        token: str | None,
        heartbeat_s: float = HEARTBEAT_S,
        labels: tuple[str, ...] = (),
        region: str | None = None,
        *,
        drain_timeout_s: float = DRAIN_TIMEOUT_S,
        jitter: Jitter = full_jitter,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        pool: WorkerPool | None = None,
    ) -> None:
        """`pool`: child processes that serve the sessions (`--processes`); None: this one."""
        urls = (signaling_urls,) if isinstance(signaling_urls, str) else tuple(signaling_urls)
        self.worker = worker
        self.links = SignalingLinks(urls, jitter)
        self.url = urls[0]  # the one connected to, or tried, last
        self.token = token
        self.heartbeat_s = heartbeat_s
        self.connect_timeout_s = connect_timeout_s
        self.service = worker_service(worker, self._send, labels, region, pool)
        self.service.on_drain = self.start_drain
        self.drain = Drain(self.service, drain_timeout_s)
        self.registered = asyncio.Event()  # registered through the socket open now
        self.left: str | None = None  # the reason of `worker.leaving`, once sent
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._registered_here = False  # this connection got `worker.registered`
        self._refusal_logged = False
        self._unsent: dict[str, WorkerSessionEnded] = {}
        self._stopped = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._leave_task: asyncio.Task[None] | None = None

    # -- what the process sees ---------------------------------------------------------------

    @property
    def draining(self) -> bool:
        return self.drain.active

    def status(self) -> dict[str, Any]:
        return {
            "draining": self.draining,
            "registered": self.registered.is_set(),
            "sessions": len(self.service.sessions),
        }

    def start_drain(self, reason: str, deadline_s: float | None = None) -> bool:
        """Hand every session over and leave (worker/drain.py); False if already draining."""
        if self.left is not None or not self.drain.start(reason, deadline_s):
            return False
        self._spawn(self._leave_when_drained())
        return True

    async def stop(self, reason: str = "stopped") -> None:
        """Leave now: `worker.leaving`, the sessions closed, the socket closed; `run` returns."""
        await self.drain.cancel()
        await self._leave(reason)

    async def run(self) -> None:
        """Connect, serve and reconnect until the worker leaves (drained, or `stop`)."""
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            connections = asyncio.get_running_loop().create_task(self._connections(http))
            try:
                await self._stopped.wait()
            finally:
                if self.left is None:  # cancelled: leave all the same
                    with contextlib.suppress(Exception):
                        await asyncio.shield(self._leave("stopped"))
                self._stopped.set()  # no new connection from here on
                connections.cancel()  # its socket is closed on the way out
                await asyncio.gather(connections, return_exceptions=True)
                await self._close_socket()
                await self.drain.cancel()
                await self._cancel_tasks()
                await self.service.cancel()

    # -- connections -------------------------------------------------------------------------

    async def _connections(self, http: aiohttp.ClientSession) -> None:
        # the flag as well as the cancellation: Python 3.11's wait_for can lose a cancellation
        # that comes as the connection opens
        while not self._stopped.is_set():
            url = self.links.next_url()
            started = time.monotonic()
            registered = await self._serve_once(http, url)
            sleep = self.links.connection_over(registered, time.monotonic() - started)
            if sleep is not None and not self._stopped.is_set():
                await asyncio.sleep(sleep)

    async def _serve_once(self, http: aiohttp.ClientSession, url: str) -> bool:
        """One connection to `url`, until it drops; whether it registered the worker."""
        self.url = url
        self._registered_here = self._refusal_logged = False
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                ws = await http.ws_connect(
                    url, headers=headers, protocols=(SUBPROTOCOL,), heartbeat=20.0,
                    max_msg_size=RELAYED_MESSAGE_BYTES,
                )  # fmt: skip
        except (*NETWORK_ERRORS, ValueError) as exc:
            self.links.failed(url, _describe(exc))
            return False
        if self._stopped.is_set():
            with contextlib.suppress(*NETWORK_ERRORS):
                await ws.close()
            return False
        error = ""
        self._ws = ws
        beat = asyncio.get_running_loop().create_task(self._heartbeats(ws))
        try:
            await ws.send_str(encode_message(self.service.registration()))
            async for msg in ws:
                if msg.type != aiohttp.WSMsgType.TEXT:
                    break
                try:
                    self._dispatch(msg.data)
                except Exception:  # a bug of ours: that message is lost, not the worker
                    log.exception("worker.dispatch_failed")
        except NETWORK_ERRORS as exc:
            error = _describe(exc)
        finally:
            self._ws = None
            self.registered.clear()
            beat.cancel()
            await asyncio.gather(beat, return_exceptions=True)
            with contextlib.suppress(*NETWORK_ERRORS):
                await ws.close()
        error = error or f"closed ({ws.close_code})"
        if self._registered_here:
            if self.left is None:
                self.links.lost(url, ws.close_code, error, len(self.service.sessions))
        else:
            self.links.failed(url, error)
        return self._registered_here

    def _dispatch(self, data: str) -> None:
        try:
            doc = read_json(data, RELAYED_JSON)
            if isinstance(doc, dict) and doc.get("type") == "error":
                self._error(doc)
                return
            message = parse_document(check_document(doc), TO_WORKER)
        except ProtocolError as exc:
            log.warning("worker.bad_message", extra={"code": exc.code, "detail": exc.message})
            return
        if isinstance(message, Registered):
            self._registered_here = True
            self.registered.set()
            self.links.registered(self.url, message.worker_id)
            self.worker.metrics.worker_status().registrations.inc()
            self._spawn(self._after_registration())
            return
        self.service.submit(message)

    def _error(self, doc: dict[str, Any]) -> None:
        reason = str(doc.get("message"))[:500]
        if not self._registered_here:  # refused (a duplicate id, a bad token): say why, once
            if not self._refusal_logged:
                self._refusal_logged = True
                log.error("worker.refused", extra={"reason": reason, "url": self.url})
            return
        log.warning("worker.signaling_error", extra={"code": doc.get("code"), "reason": reason})

    async def _after_registration(self) -> None:
        """What signaling may have missed while the worker was away."""
        unsent, self._unsent = self._unsent, {}
        for message in unsent.values():
            await self._send(message)
        await self.drain.announce()

    async def _heartbeats(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        while not ws.closed:
            await asyncio.sleep(self.heartbeat_s)
            if self.registered.is_set():
                await self._send(self.service.heartbeat())

    async def _send(self, message: FromWorker) -> None:
        """Send on the socket if registered; else a `session.ended` waits for the next
        registration, and anything else is dropped (signaling learns from the registration)."""
        ws = self._ws
        if ws is not None and not ws.closed and self.registered.is_set():
            try:
                await ws.send_str(encode_message(message))
                return
            except (ConnectionError, RuntimeError, aiohttp.ClientError):
                pass
        if isinstance(message, WorkerSessionEnded) and self.left is None:
            self._unsent.pop(message.session_id, None)
            self._unsent[message.session_id] = message
            while len(self._unsent) > MAX_UNSENT_ENDED:
                del self._unsent[next(iter(self._unsent))]

    # -- leaving -----------------------------------------------------------------------------

    async def _leave_when_drained(self) -> None:
        await self.drain.finished.wait()
        if self.drain.outcome is not None:
            await self._leave(self.drain.outcome)

    async def _leave(self, reason: str) -> None:
        if self._leave_task is None:
            self._leave_task = asyncio.get_running_loop().create_task(self._leaving(reason))
        await asyncio.shield(self._leave_task)

    async def _leaving(self, reason: str) -> None:
        """`worker.leaving` first (signaling places the sessions elsewhere), then the sessions
        still here closed, then the socket."""
        try:
            sessions = len(self.service.sessions)
            log.info("worker.leaving", extra={"reason": reason, "sessions": sessions})
            await self._send(WorkerLeaving(reason))
            self.left = reason
            await self.service.close_all(reason)
        finally:
            self.left = self.left or reason
            self._stopped.set()

    async def _close_socket(self) -> None:
        ws = self._ws
        if ws is not None:
            with contextlib.suppress(*NETWORK_ERRORS):
                async with asyncio.timeout(2.0):
                    await ws.close()

    def _spawn(self, job: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(job)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _cancel_tasks(self) -> None:
        tasks = [t for t in self._tasks if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._leave_task is not None:
            await asyncio.gather(self._leave_task, return_exceptions=True)


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


__all__ = ["BACKOFF_MAX_S", "BACKOFF_START_S", "WorkerAgent"]
