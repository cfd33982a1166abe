"""The one JSON reader of every edge: size, nesting depth and element count checked before any
object is built, so hostile input gets a coded error and never a RecursionError or a traceback.

Python's `json` recurses once per nesting level: a few thousand brackets exhaust the stack
(`RecursionError`, which no `except ValueError` catches). The shape of a document is therefore
measured first, in one pass over its structural characters (string contents skipped, escapes
honoured), and only a document within the limits is parsed. NaN and Infinity, which `json`
accepts but JSON does not, are refused.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Final, NoReturn

from render_server.protocol.errors import ErrorCode, ProtocolError

_STRUCTURE: Final = re.compile(r'[\\"\[\]{},]')


@dataclass(frozen=True)
class JsonLimits:
    max_bytes: int
    max_depth: int = 32  # nesting of arrays and objects; our messages use 4 at most
    max_items: int = 4096  # arrays and objects opened plus the commas between elements


def read_json(data: str | bytes, limits: JsonLimits) -> Any:
    """The JSON value of `data`, or ProtocolError: `too_large` over `max_bytes`, `bad_json` for
    anything that is not JSON within the depth and element limits (invalid UTF-8 included)."""
    size = len(data) if isinstance(data, bytes) else _utf8_length(data)
    if size > limits.max_bytes:
        raise ProtocolError(
            ErrorCode.TOO_LARGE, f"message is {size} bytes; the limit is {limits.max_bytes}"
        )
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProtocolError(ErrorCode.BAD_JSON, f"message is not UTF-8: {exc}") from None
    else:
        text = data
    check_shape(text, limits.max_depth, limits.max_items)
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(ErrorCode.BAD_JSON, f"message is not valid JSON: {exc}") from None


def check_shape(text: str, max_depth: int, max_items: int) -> None:
    """ProtocolError (`bad_json`) when `text` nests deeper than `max_depth` or holds more than
    `max_items` arrays, objects and elements. Linear in the number of structural characters."""
    depth = items = 0
    in_string = False
    escaped_at = -1  # the position of the character a backslash escapes
    for match in _STRUCTURE.finditer(text):
        at = match.start()
        if at == escaped_at:
            continue
        char = text[at]
        if in_string:
            if char == "\\":
                escaped_at = at + 1
            elif char == '"':
                in_string = False
            continue
        if char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            items += 1
            if depth > max_depth:
                raise ProtocolError(
                    ErrorCode.BAD_JSON, f"message nests deeper than {max_depth} levels"
                )
        elif char in "]}":
            depth -= 1
        elif char == ",":
            items += 1
        if items > max_items:
            raise ProtocolError(
                ErrorCode.BAD_JSON, f"message holds more than {max_items} elements"
            )


def _utf8_length(text: str) -> int:
    if text.isascii():
        return len(text)
    return len(text.encode("utf-8", "surrogatepass"))


def _refuse_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")
