"""`render-server worker`: a worker process that registers with a signaling server over a
WebSocket, sends heartbeats and serves the sessions placed on it. It reconnects with backoff;
sessions do not survive a lost signaling connection (the server re-places them meanwhile)."""

from __future__ import annotations

import asyncio
import logging

import aiohttp

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
from render_server.protocol.worker import TO_WORKER, FromWorker, Registered
from render_server.worker.local import LocalWorker
from render_server.worker.service import WorkerService

log = logging.getLogger(__name__)

BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 10.0


class WorkerAgent:
    def __init__(
        self,
        worker: LocalWorker,
        signaling_url: str,
        token: str | None,
        heartbeat_s: float = 2.0,
        labels: tuple[str, ...] = (),
        region: str | None = None,
    ) -> None:
        self.worker = worker
        self.url = signaling_url
        self.token = token
        self.heartbeat_s = heartbeat_s
        self.service = WorkerService(worker, self._send, labels, region)
        self.registered = asyncio.Event()
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._stopping = False

    async def run(self) -> None:
        """Connect, serve, and reconnect until `stop()`."""
        delay = BACKOFF_START_S
        async with aiohttp.ClientSession() as http:
            while not self._stopping:
                try:
                    await self._serve_once(http)
                    delay = BACKOFF_START_S
                except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                    log.warning("worker.signaling_unreachable", extra={"error": str(exc)[:200]})
                finally:
                    self.registered.clear()
                    await self.service.close_all("signaling_lost")
                if not self._stopping:
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, BACKOFF_MAX_S)

    async def stop(self) -> None:
        self._stopping = True
        if self._ws is not None:
            await self._ws.close()

    async def _serve_once(self, http: aiohttp.ClientSession) -> None:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        async with http.ws_connect(
            self.url, headers=headers, protocols=(SUBPROTOCOL,), heartbeat=20.0,
            max_msg_size=RELAYED_MESSAGE_BYTES,
        ) as ws:  # fmt: skip
            self._ws = ws
            await ws.send_str(encode_message(self.service.registration()))
            beat = asyncio.get_running_loop().create_task(self._heartbeats(ws))
            try:
                async for msg in ws:
                    if msg.type != aiohttp.WSMsgType.TEXT:
                        break
                    try:
                        self._dispatch(msg.data)
                    except Exception:  # a bug of ours: that message is lost, not the worker
                        log.exception("worker.dispatch_failed")
            finally:
                beat.cancel()
                await self.service.drain()
                self._ws = None
            if ws.close_code not in (None, 1000):
                log.warning("worker.disconnected", extra={"code": ws.close_code})

    def _dispatch(self, data: str) -> None:
        try:
            doc = read_json(data, RELAYED_JSON)
            if isinstance(doc, dict) and doc.get("type") == "error":  # refused: say why
                log.error("worker.refused", extra={"reason": str(doc.get("message"))[:500]})
                return
            message = parse_document(check_document(doc), TO_WORKER)
        except ProtocolError as exc:
            log.warning("worker.bad_message", extra={"code": exc.code, "detail": exc.message})
            return
        if isinstance(message, Registered):
            self.registered.set()
            log.info("worker.registered", extra={"worker": message.worker_id, "url": self.url})
            return
        self.service.submit(message)

    async def _heartbeats(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        while not ws.closed:
            await asyncio.sleep(self.heartbeat_s)
            await self._send(self.service.heartbeat())

    async def _send(self, message: FromWorker) -> None:
        ws = self._ws
        if ws is not None and not ws.closed:
            try:
                await ws.send_str(encode_message(message))
            except (ConnectionError, RuntimeError):
                pass


__all__ = ["WorkerAgent"]
