"""A batch of RTP packets SRTP-protected into one buffer, without a copy back out per packet.

pylibsrtp's `Session.protect` copies the packet into the session's 1,500-byte buffer, protects
it in place, and copies the result out as new bytes, with a fresh `int *` for its length each
time. Here each packet of a batch is protected in its own slot of one buffer that lives as long
as the sender, and the batch leaves as views of those slots (`udp_segments` hands them to
`sendmsg` as they are), so what remains per packet is the copy in and libsrtp itself. The views
are valid until the next `protect`: the caller sends them first.

Checked against pylibsrtp 1.0 (libsrtp 2): `Session._srtp` (the `srtp_t *`), `_binding.ffi`,
`lib.srtp_protect(srtp_t, void *, int *)`, and its limit of 1,500 bytes less the trailer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

from pylibsrtp import Error, Session
from pylibsrtp._binding import ffi, lib

SLOT: Final = 1500  # pylibsrtp's own buffer: a packet and its trailer fit in one
TRAILER: Final = 16 + 128  # SRTP_MAX_TAG_LEN + SRTP_MAX_MKI_LEN, as pylibsrtp reserves
BATCH: Final = 64  # slots; a longer batch is protected and sent in turns


class BatchProtector:
    """SRTP for one session's outgoing RTP, a batch at a time."""

    def __init__(self, session: Session) -> None:
        self.session = session  # also holds the libsrtp context alive
        self._context = session._srtp[0]
        self._cdata = ffi.new("char[]", SLOT * BATCH)
        self._view = memoryview(ffi.buffer(self._cdata))
        self._length = ffi.new("int *")

    def protect(
        self, packets: Sequence[bytes | bytearray], refused: Callable[[Exception], None]
    ) -> tuple[list[memoryview], list[bytes | bytearray]]:
        """The protected packets (at most `BATCH`) and the plain ones they came from; a packet
        libsrtp refuses is told to `refused` and left out of both."""
        assert len(packets) <= BATCH
        view, cdata, length, context = self._view, self._cdata, self._length, self._context
        protect = lib.srtp_protect
        wires: list[memoryview] = []
        plains: list[bytes | bytearray] = []
        offset = 0
        for data in packets:
            size = len(data)
            if size > SLOT - TRAILER:
                refused(ValueError("packet is too long"))
                continue
            view[offset : offset + size] = data
            length[0] = size
            status = protect(context, cdata + offset, length)
            if status:
                refused(Error(f"srtp_protect failed: {status}"))
                continue
            wires.append(view[offset : offset + length[0]])
            plains.append(data)
            offset += SLOT
        return wires, plains


def batches(packets: Sequence[Any]) -> list[Sequence[Any]]:
    """`packets` in turns of at most `BATCH`."""
    if len(packets) <= BATCH:
        return [packets]
    return [packets[i : i + BATCH] for i in range(0, len(packets), BATCH)]
