"""What a session needs of a worker (`requirements` of `session.start` and POST /api/sessions),
and whether a worker has it."""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from render_server.protocol.errors import ErrorCode, ProtocolError
from render_server.protocol.wire import Document, labels_field, optional_name

RESOLUTION: Final = re.compile(r"[0-9]{2,5}x[0-9]{2,5}")  # ASCII: `\d` takes any script's digits
# The largest frame the protocol knows: H.264 level 6.2's (config.py's stream limits too). A
# requirement above it can never be met by any worker, now or later: refused as malformed.
MAX_WIDTH: Final = 7680
MAX_HEIGHT: Final = 4320
MAX_CODECS: Final = 16  # a browser decodes a handful; more is not a browser
CODEC_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,31}")


class WorkerFacts(Protocol):
    """What requirements are judged against: a worker's registration, as the registry holds it."""

    @property
    def capabilities(self) -> Mapping[str, Any]: ...

    @property
    def labels(self) -> Collection[str]: ...

    @property
    def region(self) -> str | None: ...


@dataclass(frozen=True)
class Requirements:
    """What a browser needs of a worker; empty means any worker."""

    labels: frozenset[str] = frozenset()  # the worker must carry every one of these labels
    region: str | None = None
    codec: str | None = None  # e.g. "H264": must be in capabilities["codecs"]
    resolution: str | None = None  # "WxH": capabilities["resolution"] must be at least as big
    # the codecs the browser decodes (the SDK sends them, best first): the worker must send one
    codecs: tuple[str, ...] = ()

    def fits(self, worker: WorkerFacts) -> bool:
        """Whether the worker can serve the session; the registry's Lua has a twin (fits.lua)."""
        if not self.labels <= set(worker.labels):
            return False
        if self.region is not None and worker.region != self.region:
            return False
        caps = worker.capabilities
        if self.codec is not None and self.codec not in caps.get("codecs", ()):
            return False
        if self.codecs and not set(self.codecs) & set(caps.get("codecs", ())):
            return False
        if self.resolution is not None:
            want_w, want_h = (int(v) for v in self.resolution.lower().split("x"))
            have = str(caps.get("resolution", "0x0")).lower().split("x")
            if int(have[0]) < want_w or int(have[1]) < want_h:
                return False
        return True

    def as_dict(self) -> dict[str, Any]:
        return {
            "labels": sorted(self.labels),
            "region": self.region,
            "codec": self.codec,
            "resolution": self.resolution,
            "codecs": list(self.codecs),
        }

    @classmethod
    def from_dict(cls, doc: Document) -> Requirements:
        """Back from `as_dict` (a store's copy): trusted, not checked."""
        return cls(
            labels=frozenset(doc.get("labels") or ()),
            region=doc.get("region"),
            codec=doc.get("codec"),
            resolution=doc.get("resolution"),
            codecs=tuple(doc.get("codecs") or ()),
        )


def codecs_field(raw: Document) -> tuple[str, ...]:
    """`codecs`: up to MAX_CODECS codec names (a browser's decodable codecs), upper-cased as
    RTP names are compared; absent means any."""
    codecs = raw.get("codecs") or []
    if (
        not isinstance(codecs, list)
        or len(codecs) > MAX_CODECS
        or not all(isinstance(c, str) and CODEC_NAME.fullmatch(c) for c in codecs)
    ):
        raise ProtocolError(
            ErrorCode.BAD_MESSAGE,
            f"`codecs` must be a list of at most {MAX_CODECS} codec names (e.g. H264, VP8)",
        )
    return tuple(dict.fromkeys(c.upper() for c in codecs))


def parse_requirements(raw: Any) -> Requirements:
    """A client's `requirements` object (None: no requirement), or ProtocolError."""
    if raw is None:
        return Requirements()
    if not isinstance(raw, dict):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "`requirements` must be an object")
    try:
        resolution = raw.get("resolution")
        if resolution is not None and not (
            isinstance(resolution, str) and RESOLUTION.fullmatch(resolution)
        ):
            raise ProtocolError(ErrorCode.BAD_MESSAGE, "`resolution` must be WxH")
        if resolution is not None:
            width, height = (int(side) for side in resolution.split("x"))
            if width > MAX_WIDTH or height > MAX_HEIGHT:
                raise ProtocolError(
                    ErrorCode.BAD_MESSAGE, f"`resolution` is over {MAX_WIDTH}x{MAX_HEIGHT}"
                )
        return Requirements(
            labels=frozenset(labels_field(raw, "labels")),
            region=optional_name(raw, "region"),
            codec=optional_name(raw, "codec"),
            resolution=resolution,
            codecs=codecs_field(raw),
        )
    except ProtocolError as exc:
        raise ProtocolError(exc.code, f"in `requirements`: {exc.message}") from None


def unservable_reason(requirements: Requirements, workers: Iterable[Mapping[str, Any]]) -> str:
    """Why none of the registered workers (their capabilities) can serve `requirements`: for a
    browser whose codecs none of them sends, the codecs on each side."""
    generic = "no registered worker can meet the requirements"
    if not requirements.codecs:
        return generic
    sent = sorted({c for caps in workers for c in caps.get("codecs", ())})
    if set(sent) & set(requirements.codecs):
        return generic
    return (
        f"no registered worker sends a codec this browser decodes: the browser takes "
        f"{', '.join(requirements.codecs)}; the workers send {', '.join(sent) or 'nothing'}"
    )
