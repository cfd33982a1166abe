"""A worker that speaks the worker protocol but renders nothing: it opens every session at
once and answers offers with a placeholder. For scheduling tests and signaling benchmarks,
where the point is placement, not pixels."""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import asdict
from typing import Any

import aiohttp

from render_server.protocol.viewers import (
    ViewerAnswer,
    ViewerIce,
    ViewerLeave,
    ViewerOffer,
    ViewersEnd,
)
from render_server.protocol.wire import SUBPROTOCOL, encode_message
from render_server.protocol.worker import (
    CloseSession,
    Heartbeat,
    OpenSession,
    Register,
    Registered,
    SessionOffer,
    SessionOpened,
    WorkerAnswer,
    WorkerSessionEnded,
    parse_to_worker,
)

PLACEHOLDER_SDP = "v=0\r\no=- 0 0 IN IP4 127.0.0.1\r\ns=fake worker\r\nt=0 0\r\n"


class FakeWorker:
    def __init__(
        self,
        url: str,
        worker_id: str,
        slots: int,
        token: str | None = None,
        labels: tuple[str, ...] = (),
        region: str | None = None,
        capabilities: dict[str, Any] | None = None,
        heartbeat_s: float = 1.0,
    ) -> None:
        self.url = url
        self.worker_id = worker_id
        self.slots = slots
        self.token = token
        self.labels = labels
        self.region = region
        self.capabilities = capabilities or {"codecs": ["H264"], "resolution": "1280x720"}
        self.heartbeat_s = heartbeat_s
        self.sessions: set[str] = set()
        self.opened: list[str] = []  # every session ever opened here, in order
        self.ice_servers: dict[str, list[dict[str, Any]]] = {}  # per session, as received
        self.errors: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.names: dict[str, str | None] = {}  # each session's owner name, as opened
        # what signaling asked about viewers, in order (offers are answered at once)
        self.viewer_requests: asyncio.Queue[ViewerOffer | ViewerIce | ViewerLeave] = asyncio.Queue()
        self.registered = asyncio.Event()
        self._http: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self._http = aiohttp.ClientSession()
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self._ws = await self._http.ws_connect(self.url, headers=headers, protocols=(SUBPROTOCOL,))
        await self._send(
            Register(self.worker_id, self.slots, self.capabilities, self.labels, self.region)
        )
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._read()), loop.create_task(self._beat())]
        await asyncio.wait_for(self.registered.wait(), 10)

    async def end_session(self, session_id: str, reason: str = "done") -> None:
        """The worker ends a session on its own (as an idle timeout would)."""
        self.sessions.discard(session_id)
        await self._send(WorkerSessionEnded(session_id, reason))

    async def send_raw(self, doc: dict[str, Any]) -> None:
        """Any message, as a misbehaving worker would send it."""
        assert self._ws is not None
        await self._ws.send_str(json.dumps({"v": 1, **doc}))

    async def next_error(self, timeout: float = 10) -> dict[str, Any]:
        return await asyncio.wait_for(self.errors.get(), timeout)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._ws is not None:
            await self._ws.close()
        if self._http is not None:
            await self._http.close()

    async def _read(self) -> None:
        assert self._ws is not None
        async for msg in self._ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                break
            doc = json.loads(msg.data)
            if doc.get("type") == "error":
                self.errors.put_nowait(doc)
                continue
            with contextlib.suppress(Exception):
                await self._handle(parse_to_worker(msg.data))

    async def _handle(self, message: Any) -> None:
        if isinstance(message, Registered):
            self.registered.set()
        elif isinstance(message, OpenSession):
            self.ice_servers[message.session_id] = [
                {k: v for k, v in asdict(server).items() if v is not None}
                for server in message.ice_servers
            ]
            self.sessions.add(message.session_id)
            self.opened.append(message.session_id)
            self.names[message.session_id] = message.name
            await self._send(SessionOpened(message.session_id, 64, 64, 10.0, "H264"))
        elif isinstance(message, SessionOffer):
            await self._send(WorkerAnswer(message.session_id, PLACEHOLDER_SDP))
        elif isinstance(message, CloseSession):
            await self.end_session(message.session_id, message.reason)
        elif isinstance(message, ViewerOffer | ViewerIce | ViewerLeave | ViewersEnd):
            self.viewer_requests.put_nowait(message)
            if isinstance(message, ViewerOffer):
                answer = ViewerAnswer(message.session_id, message.viewer_id, PLACEHOLDER_SDP)
                await self._send(answer)

    async def send_message(self, message: Any) -> None:
        """A well-formed message of the worker protocol (a viewer's `viewer.ended`, say)."""
        await self._send(message)

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_s)
            await self._send(Heartbeat(len(self.sessions)))

    async def _send(self, message: Any) -> None:
        if self._ws is not None and not self._ws.closed:
            with contextlib.suppress(ConnectionError, RuntimeError):
                await self._ws.send_str(encode_message(message))
