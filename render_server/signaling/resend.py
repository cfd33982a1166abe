"""Requests sent again while unanswered. The bus delivers at most once, and Redis keeps no
message for a replica that is still resubscribing after an outage: an open published by the
replica that came back first, to a worker whose replica came back a few milliseconds later, was
lost, and the session failed at its open timeout (the fleet's Redis-outage test in CI)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Final

from render_server.logs import SessionLogger

OPEN_RESENDS: Final = (0.15, 0.3, 0.5)  # shares of the open timeout (a worker answers a repeat)


async def sleep_resending(
    seconds: float,
    unanswered: Callable[[], bool],
    send: Callable[[], Awaitable[None]],
    log: SessionLogger,
    event: str,
) -> None:
    """Sleep `seconds`; at each of `OPEN_RESENDS`' shares of it on the way, `send()` again
    (logged as `event`) while `unanswered()`."""
    waited = 0.0
    for share in OPEN_RESENDS:
        await asyncio.sleep(share * seconds - waited)
        waited = share * seconds
        if unanswered():
            log.info(event)
            await send()
    await asyncio.sleep(seconds - waited)
