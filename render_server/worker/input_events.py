"""Input events from the browser's `input` data channel, validated into typed objects.

Coordinates and deltas are in units of the video element's height (so a drag means the same on
any screen size); wheel deltas are in CSS pixels. Unknown key codes are accepted and ignored.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

from ..errors import CodedError

MAX_INPUT_BYTES: Final = 2048
MAX_TOUCHES: Final = 10
MAX_COORD: Final = 100.0  # a pointer far outside any sane element
MAX_DELTA: Final = 10.0
MAX_WHEEL: Final = 10_000.0
MAX_KEY_CODE_CHARS: Final = 32


class InputError(CodedError):
    """An input message the worker refuses; answered on the data channel."""


@dataclass(frozen=True)
class PointerEvent:
    action: Literal["down", "move", "up"]
    x: float
    y: float
    dx: float
    dy: float
    buttons: int  # the DOM's bitmask: 1 left, 2 right, 4 middle
    shift: bool = False


@dataclass(frozen=True)
class WheelEvent:
    dy: float


@dataclass(frozen=True)
class KeyEvent:
    action: Literal["down", "up"]
    code: str  # KeyboardEvent.code, e.g. "KeyW", "ArrowUp"


@dataclass(frozen=True)
class TouchPoint:
    id: int
    x: float
    y: float


@dataclass(frozen=True)
class TouchEvent:
    action: Literal["start", "move", "end", "cancel"]
    touches: tuple[TouchPoint, ...]  # the touches still on the surface after this event


@dataclass(frozen=True)
class BlurEvent:
    """The page lost focus: keys held down will never see their key-up."""


InputEvent = PointerEvent | WheelEvent | KeyEvent | TouchEvent | BlurEvent


def _number(doc: dict[str, Any], key: str, limit: float, default: float | None = None) -> float:
    value = doc.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InputError("bad_input", f"`{key}` must be a finite number")
    if abs(value) > limit:
        raise InputError("bad_input", f"`{key}` is outside ±{limit:g}")
    return float(value)


def _choice(doc: dict[str, Any], key: str, allowed: tuple[str, ...]) -> Any:
    value = doc.get(key)
    if value not in allowed:
        raise InputError("bad_input", f"`{key}` must be one of {', '.join(allowed)}")
    return value


def _pointer(doc: dict[str, Any]) -> PointerEvent:
    buttons = doc.get("buttons", 0)
    if type(buttons) is not int or not 0 <= buttons < 32:
        raise InputError("bad_input", "`buttons` must be an integer bitmask 0..31")
    shift = doc.get("shift", False)
    if not isinstance(shift, bool):
        raise InputError("bad_input", "`shift` must be true or false")
    return PointerEvent(
        action=_choice(doc, "action", ("down", "move", "up")),
        x=_number(doc, "x", MAX_COORD, 0.0),
        y=_number(doc, "y", MAX_COORD, 0.0),
        dx=_number(doc, "dx", MAX_DELTA, 0.0),
        dy=_number(doc, "dy", MAX_DELTA, 0.0),
        buttons=buttons,
        shift=shift,
    )


def _key(doc: dict[str, Any]) -> KeyEvent:
    code = doc.get("code")
    if not isinstance(code, str) or not 0 < len(code) <= MAX_KEY_CODE_CHARS:
        raise InputError("bad_input", f"`code` must be a string of 1..{MAX_KEY_CODE_CHARS} chars")
    return KeyEvent(action=_choice(doc, "action", ("down", "up")), code=code)


def _touch(doc: dict[str, Any]) -> TouchEvent:
    raw = doc.get("touches", [])
    if not isinstance(raw, list) or len(raw) > MAX_TOUCHES:
        raise InputError("bad_input", f"`touches` must be a list of at most {MAX_TOUCHES}")
    touches = []
    for item in raw:
        if not isinstance(item, dict) or type(item.get("id")) is not int:
            raise InputError("bad_input", "each touch needs an integer `id`, `x` and `y`")
        touches.append(
            TouchPoint(item["id"], _number(item, "x", MAX_COORD), _number(item, "y", MAX_COORD))
        )
    action = _choice(doc, "action", ("start", "move", "end", "cancel"))
    return TouchEvent(action=action, touches=tuple(touches))


_PARSERS: dict[str, Callable[[dict[str, Any]], InputEvent]] = {
    "pointer": _pointer,
    "wheel": lambda doc: WheelEvent(dy=_number(doc, "dy", MAX_WHEEL)),
    "key": _key,
    "touch": _touch,
    "blur": lambda doc: BlurEvent(),
}
INPUT_TYPES: Final = tuple(_PARSERS)


def parse_input(data: str | bytes) -> InputEvent:
    """One data-channel message as a typed event, or InputError with a code and message."""
    if len(data) > MAX_INPUT_BYTES:
        raise InputError("too_large", f"input message over {MAX_INPUT_BYTES} bytes")
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise InputError("bad_json", "input message is not valid JSON") from None
    if not isinstance(doc, dict):
        raise InputError("bad_input", "input message must be a JSON object")
    kind = doc.get("type")
    parser = _PARSERS.get(kind) if isinstance(kind, str) else None
    if parser is None:
        raise InputError(
            "unknown_type", f"unknown input type {kind!r}; known: {', '.join(INPUT_TYPES)}"
        )
    return parser(doc)
