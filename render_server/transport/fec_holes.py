"""FEC packets of an in-order codec that transport feedback shows lost with every copy of theirs.

libwebrtc's H.264 receiver releases a frame only once every earlier sequence number has
come, FEC packets included (fec_path.py), so a FEC packet lost together with its RTX copy
holds every later frame until a NACK brings it back. The browser sends that NACK at once,
but when the NACK is lost it repeats it only after its idea of the round trip, 100 ms for a
stream it only receives: in the lab at 2 % loss, a 200 ms freeze. Transport-wide feedback
names every packet the browser got or missed, the FEC packet and its copy each under a
number of its own, so the sender learns of the hole about as soon as a NACK would tell it,
whether or not the NACK comes. `FecHoles` keeps which transport numbers carried which FEC
packet and, as feedback comes, names each FEC packet whose every copy sent so far was
reported missing and none received: the caller sends it again (the NACK, if it comes too,
sends another; both are cheap, as this happens to 0.04 % of FEC packets at 2 % loss).
Pure: numbers in, numbers out.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Final

KEPT: Final = 4096  # transport numbers remembered (well over a feedback interval of packets)


class FecHoles:
    """Which FEC packets (by wire number) went out under which transport-wide numbers."""

    def __init__(self) -> None:
        self._carried: OrderedDict[int, int] = OrderedDict()  # transport number → FEC wire number
        self._unheard: dict[int, int] = {}  # FEC wire number → copies not yet reported lost
        self.refilled = 0

    def sent(self, transport: int, wire: int) -> None:
        """FEC packet `wire` (or a copy of it) left under transport-wide number `transport`."""
        self._carried[transport] = wire
        self._unheard[wire] = self._unheard.get(wire, 0) + 1
        while len(self._carried) > KEPT:
            _, old = self._carried.popitem(last=False)
            self._unheard.pop(old, None)

    def feedback(self, reports: Iterable[tuple[int, bool]]) -> list[int]:
        """The FEC packets whose every copy the feedback `reports` ((transport number,
        received), as the browser sent them) now shows missing, none received."""
        holes: list[int] = []
        for transport, received in reports:
            wire = self._carried.pop(transport, None)
            if wire is None or wire not in self._unheard:
                continue
            if received:
                del self._unheard[wire]  # it came: nothing to fill
                continue
            self._unheard[wire] -= 1
            if self._unheard[wire] == 0:
                del self._unheard[wire]
                holes.append(wire)
                self.refilled += 1
        return holes
