"""`serve`'s app on its own event loop in a thread: a real server the test can reach into.

The browser tests drive Chromium through Playwright's sync API on the test's thread; the server
runs in this thread so that a test can do to it what a network or a crash would (close a
worker's peer connection, drop a browser's socket) and see how the client copes.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

from aiohttp import web

from render_server.cli.process import EMBEDDED_KEY, build_app
from render_server.config import ServerConfig
from render_server.render.scene import Scene
from render_server.signaling.context import SignalingContext
from render_server.signaling.edge import CONTEXT_KEY
from render_server.stream.session import StreamSession

from .browser import free_port

T = TypeVar("T")


class ThreadedServer:
    def __init__(self, config: ServerConfig, scene: Scene) -> None:
        self.port = free_port() if config.port == 0 else config.port
        self.config = config
        self.scene = scene
        self.url = f"http://127.0.0.1:{self.port}"
        self.loop = asyncio.new_event_loop()
        self.app: web.Application | None = None
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def start(self) -> None:
        self._thread.start()
        self.call(self._start)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.call(self._stop, timeout=20)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

    def call(self, fn: Callable[[], Awaitable[T]], timeout: float = 30) -> T:
        """Run `fn()` on the server's loop and wait for its result."""

        async def run() -> T:
            return await fn()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout)

    @property
    def ctx(self) -> SignalingContext:
        assert self.app is not None
        return self.app[CONTEXT_KEY]

    def sessions(self) -> list[StreamSession]:
        assert self.app is not None
        return list(self.app[EMBEDDED_KEY].service.sessions.values())

    def browser_sockets(self) -> list[Any]:
        """The open browser sockets, read on the server's loop (the set changes there)."""

        async def read() -> list[Any]:
            return [ws for ws in self.ctx.browser_sockets if not ws.closed]

        return self.call(read)

    async def _start(self) -> None:
        import dataclasses

        config = dataclasses.replace(self.config, port=self.port)
        self.app = await build_app(config, self.scene)
        self._runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=2.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@contextlib.contextmanager
def threaded_server(config: ServerConfig, scene: Scene) -> Iterator[ThreadedServer]:
    server = ThreadedServer(config, scene)
    server.start()
    try:
        yield server
    finally:
        server.stop()
