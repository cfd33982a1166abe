"""The one JSON reader of every edge: size, nesting depth and element count checked before any
object is built, so hostile input gets a coded error and never a RecursionError or a traceback.

Python's `json` recurses once per nesting level: a few thousand brackets exhaust the stack
(`RecursionError`, which no `except ValueError` catches). The shape of a document is therefore
measured first (string contents skipped, escapes honoured), by the regex engine and str methods
in linear time, and only a document within the limits is parsed. NaN and Infinity, which `json`
accepts but JSON does not, are refused, as is a number too large for a float (1e999).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, Final, NoReturn

from render_server.protocol.errors import ErrorCode, ProtocolError

# A JSON string, or an unterminated one up to the end (a lone backslash last included): every
# match attempt from a quote succeeds, so one pass stays linear whatever quotes and backslashes
# the text holds. Possessive (`*+`): no backtracking.
_STRING: Final = re.compile(r'"(?:[^"\\]++|\\[\s\S]?)*+(?:"|\Z)')
_NOT_BRACKET: Final = re.compile(r"[^\[\]{}]+")
_STEP: Final = {"[": 1, "{": 1, "]": -1, "}": -1}
_SURROGATE_ESCAPE: Final = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE: Final = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class JsonLimits:
    max_bytes: int
    max_depth: int = 32  # nesting of arrays and objects; our messages use 4 at most
    max_items: int = 4096  # arrays and objects opened plus the commas between elements


def read_json(data: str | bytes, limits: JsonLimits) -> Any:
    """The JSON value of `data`, or ProtocolError: `too_large` over `max_bytes` (UTF-8 bytes),
    `bad_json` for anything that is not JSON within the depth and element limits (invalid UTF-8
    and unpaired surrogates included)."""
    if isinstance(data, bytes):
        raw = data
    else:
        try:
            raw = data.encode("utf-8")  # the size on the wire; a lone surrogate is no text
        except UnicodeEncodeError as exc:
            raise ProtocolError(ErrorCode.BAD_JSON, f"message is not Unicode text: {exc}") from None
    if len(raw) > limits.max_bytes:
        raise ProtocolError(
            ErrorCode.TOO_LARGE, f"message is {len(raw)} bytes; the limit is {limits.max_bytes}"
        )
    if isinstance(data, str):
        text = data
    else:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProtocolError(ErrorCode.BAD_JSON, f"message is not UTF-8: {exc}") from None
    check_shape(text, limits.max_depth, limits.max_items)
    # a number overflows a float only with an exponent or 309 digits before its point: text
    # with neither is read without the per-float hook (a timing message: 20 us, not 33)
    decoder = _DECODER if _may_overflow(raw) else _PLAIN_DECODER
    try:
        value = decoder.decode(text)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(ErrorCode.BAD_JSON, f"message is not valid JSON: {exc}") from None
    # "\ud800" alone is valid JSON but no text: a string holding it cannot be written out as
    # UTF-8 again (a log line, a reply), so it is refused here, at the edge
    if _SURROGATE_ESCAPE.search(text) and _holds_lone_surrogate(value):
        raise ProtocolError(ErrorCode.BAD_JSON, "message holds an unpaired surrogate escape")
    return value


def check_shape(text: str, max_depth: int, max_items: int) -> None:
    """ProtocolError (`bad_json`) when `text` nests deeper than `max_depth` or holds more than
    `max_items` arrays, objects and elements. Linear in the text's length, and done by the regex
    engine and str methods: 64 KiB of quotes or backslashes, the worst case, take about 1 ms."""
    # every bracket and comma of the text, strings' included, within the limits: so are the
    # structure's (an input move, a few times a frame, takes this way: 0.3 us, not 3.5)
    raw_opened = text.count("[") + text.count("{")
    if raw_opened <= max_depth and raw_opened + text.count(",") <= max_items:
        return
    bare = _STRING.sub("", text)  # what strings hold is no structure
    opened = bare.count("[") + bare.count("{")
    if opened + bare.count(",") > max_items:
        raise ProtocolError(ErrorCode.BAD_JSON, f"message holds more than {max_items} elements")
    brackets = _NOT_BRACKET.sub("", bare)
    # more closed than opened is no JSON; refusing it bounds the scan below by 2 * max_items
    if len(brackets) > 2 * opened:
        raise ProtocolError(ErrorCode.BAD_JSON, "message is not valid JSON: unbalanced brackets")
    if max(accumulate(map(_STEP.__getitem__, brackets)), default=0) > max_depth:
        raise ProtocolError(ErrorCode.BAD_JSON, f"message nests deeper than {max_depth} levels")


def _holds_lone_surrogate(value: Any) -> bool:
    """Whether a string in `value` holds a surrogate: `json` joins each escaped pair into one
    character, so any surrogate left is unpaired. At most max_items containers to walk."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _refuse_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    # 1e999 is valid JSON but no float: refused as Infinity is, rather than read as inf
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:32]} is out of a float's range")
    return value


# decoders made once: `json.loads` with hooks builds a new one each call (1.7 us)
_DECODER: Final = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float)
_PLAIN_DECODER: Final = json.JSONDecoder(parse_constant=_refuse_constant)
_DIGITS_AS_ZERO: Final = bytes.maketrans(b"123456789E", b"000000000e")
_LONGEST_FINITE_RUN: Final = 308  # digits: 1e308 < max float < 1e309


def _may_overflow(raw: bytes) -> bool:
    """Whether a number in `raw` may be too large for a float: JSON's exponent always follows a
    digit. Strings included (a false alarm costs the hooked decoder); bytes.translate and `in`
    take 1 us where a regex took 50."""
    mapped = raw.translate(_DIGITS_AS_ZERO)
    return b"0e" in mapped or b"0" * (_LONGEST_FINITE_RUN + 1) in mapped
