"""A signaling server that speaks the worker protocol and nothing more, for the worker's tests:
it accepts `/worker` sockets, answers `worker.register` with `worker.registered` (or refuses),
records every message, and sends what a test asks of it."""

from __future__ import annotations

import json
import time
from typing import Any

from aiohttp import WSMsgType, web
from aiohttp.test_utils import TestServer

from render_server.protocol.wire import SUBPROTOCOL

from .support import eventually_async


def sid(n: int) -> str:
    """A session id (32 hex digits)."""
    return f"{n:032x}"


class FakeSignaling:
    def __init__(self, refuse: str | None = None) -> None:
        self.refuse = refuse  # answer each registration with this error, then close
        self.accept = True  # False: answer the upgrade with 503 (a replica that is down)
        self.messages: list[dict[str, Any]] = []  # every message received, in order
        self.connects: list[float] = []  # monotonic time of each connection attempt
        self.registers: list[dict[str, Any]] = []
        self.after_register: list[dict[str, Any]] = []  # sent after each `worker.registered`
        self.sockets: list[web.WebSocketResponse] = []
        app = web.Application()
        app.router.add_get("/worker", self._worker)
        self.server = TestServer(app, host="127.0.0.1")

    @property
    def url(self) -> str:
        return str(self.server.make_url("/worker")).replace("http://", "ws://")

    async def start(self) -> FakeSignaling:
        await self.server.start_server()
        return self

    async def stop(self) -> None:
        await self.drop()
        await self.server.close()

    async def drop(self, code: int = 1011) -> None:
        """Close every open socket (a replica that went away)."""
        for ws in list(self.sockets):
            await ws.close(code=code)

    @property
    def connected(self) -> bool:
        return bool(self.sockets)

    async def send(self, doc: dict[str, Any]) -> None:
        """To the newest socket."""
        await self.sockets[-1].send_str(json.dumps({"v": 1, **doc}))

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [m for m in self.messages if m.get("type") == kind]

    def types(self) -> list[str]:
        return [str(m.get("type")) for m in self.messages if m.get("type") != "worker.heartbeat"]

    async def wait_for(
        self, kind: str, count: int = 1, timeout: float = 20.0, **fields: Any
    ) -> list[dict[str, Any]]:
        """The first `count` messages of `kind` (with these fields), once there are as many."""

        def found() -> list[dict[str, Any]] | None:
            hits = [m for m in self.of_type(kind) if all(m.get(k) == v for k, v in fields.items())]
            return hits[:count] if len(hits) >= count else None

        return await eventually_async(
            found, timeout, what=lambda: f"{count} x {kind} {fields}; got {self.types()}"
        )

    async def _worker(self, request: web.Request) -> web.StreamResponse:
        self.connects.append(time.monotonic())
        if not self.accept:
            return web.Response(status=503, text="down")
        ws = web.WebSocketResponse(protocols=(SUBPROTOCOL,))
        await ws.prepare(request)
        self.sockets.append(ws)
        try:
            async for msg in ws:
                if msg.type != WSMsgType.TEXT:
                    break
                doc = json.loads(msg.data)
                self.messages.append(doc)
                if doc.get("type") == "worker.register":
                    self.registers.append(doc)
                    if self.refuse is not None:
                        error = {"type": "error", "code": "bad_order", "message": self.refuse}
                        await ws.send_str(json.dumps({"v": 1, **error}))
                        await ws.close(code=1008)
                        break
                    registered = {"type": "worker.registered", "workerId": doc["workerId"]}
                    await ws.send_str(json.dumps({"v": 1, **registered}))
                    for extra in self.after_register:
                        await ws.send_str(json.dumps({"v": 1, **extra}))
        finally:
            self.sockets.remove(ws)
        return ws


async def until(predicate: Any, timeout: float = 20.0, what: str = "") -> Any:
    return await eventually_async(predicate, timeout, what=what)


__all__ = ["FakeSignaling", "sid", "until"]
