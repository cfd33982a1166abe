"""Delayed SACKs on a data channel's SCTP association, as RFC 9260 §6.2 asks of a receiver.

aiortc acknowledges every SCTP packet it receives at once: one SACK chunk, one DTLS record and
one datagram back for each. A designer's pointer moves come as fast as the browser reports the
mouse (`pointerrawupdate`: twice a frame interval and more), so at 4K60 a worker spent about a
tenth of its busy time sending those SACKs (py-spy, 12 streams with the harness's drag).

`delay_sacks` makes one association acknowledge as the RFC says a receiver should: at least
every second packet that carried DATA, within `SACK_DELAY_S` of the first one left
unacknowledged, and at once when the packet shows a gap or a duplicate (the peer's fast
retransmit needs to hear of those without delay). libwebrtc's own SCTP (dcsctp) does the same,
with the same 200 ms bound; the peer's retransmission timer starts far above it (RTO.Min 1 s
in the RFC, 400 ms or more in browsers), so no message is resent for want of a SACK.

Checked against aiortc 1.16: `RTCSctpTransport._handle_data` calls the instance's
`_send_sack()` after each packet whose chunks set `_sack_needed`, and `_send_sack` clears it;
duplicates and gaps are in `_sack_duplicates` and `_sack_misordered`.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Final

from aiortc import RTCSctpTransport

SACK_DELAY_S: Final = 0.2  # RFC 9260 §6.2: within 200 ms of an unacknowledged DATA chunk
SACK_EVERY: Final = 2  # … and for at least every second packet


def delay_sacks(sctp: RTCSctpTransport) -> None:
    """Acknowledge `sctp`'s packets as the module says (idempotent)."""
    send_now = sctp._send_sack
    if getattr(send_now, "delayed", False):
        return
    pending = 0  # packets whose SACK waits
    timer: asyncio.TimerHandle | None = None

    async def send() -> None:
        nonlocal pending, timer
        if timer is not None:
            timer.cancel()
            timer = None
        pending = 0
        await send_now()

    async def send_sack() -> None:
        nonlocal pending, timer
        pending += 1
        if pending >= SACK_EVERY or sctp._sack_misordered or sctp._sack_duplicates:
            await send()
        elif timer is None:
            timer = asyncio.get_running_loop().call_later(SACK_DELAY_S, due)

    def due() -> None:
        nonlocal timer
        timer = None
        if sctp._sack_needed and sctp._association_state == RTCSctpTransport.State.ESTABLISHED:
            task = asyncio.ensure_future(_quietly(send()))
            _tasks.add(task)
            task.add_done_callback(_tasks.discard)

    send_sack.delayed = True  # type: ignore[attr-defined]
    sctp._send_sack = send_sack  # type: ignore[method-assign]


_tasks: set[asyncio.Future[Any]] = set()  # the timers' sends, kept until done


async def _quietly(sending: Any) -> None:
    """A late SACK on an association that closes meanwhile: nothing to tell anyone."""
    with contextlib.suppress(ConnectionError):
        await sending
