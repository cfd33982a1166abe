"""Shared helpers of the tests."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp.test_utils import TestServer

ServerFactory = Callable[..., Awaitable[TestServer]]


def ws_url(server: TestServer) -> str:
    return str(server.make_url("/ws")).replace("http://", "ws://")
