"""Messages from the browser's `input` data channel, validated into typed objects.

Coordinates and deltas are in units of the video element's height (so a drag means the same on
any screen size); wheel deltas are in CSS pixels. Unknown key codes are accepted and ignored.
Besides input events the channel carries requests: stream quality, a keyframe, and scene
commands (whose arguments `scene_commands` validates). docs/data-channel.md is the reference.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

from render_server.protocol.errors import CodedError, ProtocolError
from render_server.protocol.json_reader import JsonLimits, read_json

MAX_INPUT_BYTES: Final = 2048
# The deepest message is 3 levels (a command's `args` holding `target: [x, y, z]`), the widest
# about 50 elements (a gamepad's 8 axes and 32 buttons; 10 touches of 3 fields): one level and
# some 2.5x to spare. 2 KiB of `[[[...` or `[0,0,...` is refused before anything is parsed.
INPUT_JSON: Final = JsonLimits(MAX_INPUT_BYTES, max_depth=4, max_items=128)
MAX_TOUCHES: Final = 10
MAX_COORD: Final = 100.0  # a pointer far outside any sane element
MAX_DELTA: Final = 10.0
MAX_WHEEL: Final = 10_000.0
MAX_KEY_CODE_CHARS: Final = 32
MAX_GAMEPAD_AXES: Final = 8
MAX_GAMEPAD_BUTTONS: Final = 32
MAX_QUALITY_SIDE: Final = 100_000  # asked-for sizes are clamped; this only refuses nonsense
MAX_QUALITY_FPS: Final = 1000.0
MAX_QUALITY_KBPS: Final = 10_000_000.0
MAX_COMMAND_ID: Final = 2**31 - 1
MAX_NAME_CHARS: Final = 64


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
    locked: bool = False  # pointer lock: a move without buttons looks around


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


@dataclass(frozen=True)
class GamepadEvent:
    """The latest state of a standard-mapping gamepad (axes in -1..1, buttons in 0..1)."""

    axes: tuple[float, ...]
    buttons: tuple[float, ...]


@dataclass(frozen=True)
class QualityRequest:
    """Stream quality wanted by the browser; None leaves a figure as it is. Clamped later."""

    width: int | None = None
    height: int | None = None
    fps: float | None = None
    max_kbps: float | None = None


@dataclass(frozen=True)
class KeyframeRequest:
    """The browser's decoder needs an IDR (as a PLI asks, but from the page)."""


@dataclass(frozen=True)
class SceneCommand:
    """A named scene command; `args` is a JSON object checked by the command itself."""

    name: str
    args: dict[str, Any]
    id: int | None = None


@dataclass(frozen=True)
class PingRequest:
    """Clock alignment: the worker answers at once with its own clock (`pong`)."""

    id: int
    t: float  # the sender's clock, echoed


class CommandError(InputError):
    """A command refused: answered with the command's id so the page can match it."""

    def __init__(self, code: str, message: str, id: int | None = None) -> None:
        super().__init__(code, message)
        self.id = id


CameraInput = PointerEvent | WheelEvent | KeyEvent | TouchEvent | BlurEvent | GamepadEvent
InputEvent = CameraInput | QualityRequest | KeyframeRequest | SceneCommand | PingRequest
MAX_SEQ: Final = 2**53  # a JavaScript counter stays exact up to here


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


def _flag(doc: dict[str, Any], key: str) -> bool:
    value = doc.get(key, False)
    if not isinstance(value, bool):
        raise InputError("bad_input", f"`{key}` must be true or false")
    return value


def _numbers(doc: dict[str, Any], key: str, count: int, lo: float, hi: float) -> tuple[float, ...]:
    raw = doc.get(key, [])
    if not isinstance(raw, list) or len(raw) > count:
        raise InputError("bad_input", f"`{key}` must be a list of at most {count} numbers")
    values = []
    for value in raw:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InputError("bad_input", f"`{key}` must hold numbers in {lo:g}..{hi:g}")
        if not (math.isfinite(value) and lo <= value <= hi):
            raise InputError("bad_input", f"`{key}` must hold numbers in {lo:g}..{hi:g}")
        values.append(float(value))
    return tuple(values)


def _gamepad(doc: dict[str, Any]) -> GamepadEvent:
    return GamepadEvent(
        axes=_numbers(doc, "axes", MAX_GAMEPAD_AXES, -1.0, 1.0),
        buttons=_numbers(doc, "buttons", MAX_GAMEPAD_BUTTONS, 0.0, 1.0),
    )


def _positive(doc: dict[str, Any], key: str, limit: float) -> float | None:
    if key not in doc:
        return None
    value = doc[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InputError("bad_input", f"`{key}` must be a finite number")
    if not 0 < value <= limit:
        raise InputError("bad_input", f"`{key}` must lie in (0, {limit:g}]")
    return float(value)


def _quality(doc: dict[str, Any]) -> QualityRequest:
    width = _positive(doc, "width", MAX_QUALITY_SIDE)
    height = _positive(doc, "height", MAX_QUALITY_SIDE)
    if (width is None) != (height is None):
        raise InputError("bad_input", "`width` and `height` go together")
    return QualityRequest(
        width=None if width is None else int(width),
        height=None if height is None else int(height),
        fps=_positive(doc, "fps", MAX_QUALITY_FPS),
        max_kbps=_positive(doc, "maxKbps", MAX_QUALITY_KBPS),
    )


def _command(doc: dict[str, Any]) -> SceneCommand:
    id = doc.get("id")
    if id is not None and (type(id) is not int or not 0 <= id <= MAX_COMMAND_ID):
        raise CommandError("bad_command", f"`id` must be an integer 0..{MAX_COMMAND_ID}")
    name = doc.get("name")
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_CHARS:
        raise CommandError(
            "bad_command", f"`name` must be a string of 1..{MAX_NAME_CHARS} chars", id
        )
    args = doc.get("args", {})
    if not isinstance(args, dict):
        raise CommandError("bad_command", "`args` must be a JSON object", id)
    return SceneCommand(name=name, args=args, id=id)


def _pointer(doc: dict[str, Any]) -> PointerEvent:
    buttons = doc.get("buttons", 0)
    if type(buttons) is not int or not 0 <= buttons < 32:
        raise InputError("bad_input", "`buttons` must be an integer bitmask 0..31")
    shift = _flag(doc, "shift")
    return PointerEvent(
        action=_choice(doc, "action", ("down", "move", "up")),
        x=_number(doc, "x", MAX_COORD, 0.0),
        y=_number(doc, "y", MAX_COORD, 0.0),
        dx=_number(doc, "dx", MAX_DELTA, 0.0),
        dy=_number(doc, "dy", MAX_DELTA, 0.0),
        buttons=buttons,
        shift=shift,
        locked=_flag(doc, "locked"),
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
    "gamepad": _gamepad,
    "quality": _quality,
    "keyframe": lambda doc: KeyframeRequest(),
    "command": _command,
    "ping": lambda doc: PingRequest(_seq(doc, "id"), _number(doc, "t", 1e15)),
}
INPUT_TYPES: Final = tuple(_PARSERS)


def event_type(event: InputEvent) -> str:
    """The message `type` an event came as (a metrics label)."""
    return _EVENT_TYPES[type(event)]


_EVENT_TYPES: Final[dict[type, str]] = {
    PointerEvent: "pointer",
    WheelEvent: "wheel",
    KeyEvent: "key",
    TouchEvent: "touch",
    BlurEvent: "blur",
    GamepadEvent: "gamepad",
    QualityRequest: "quality",
    KeyframeRequest: "keyframe",
    SceneCommand: "command",
    PingRequest: "ping",
}


def _seq(doc: dict[str, Any], key: str) -> int:
    value = doc.get(key)
    if type(value) is not int or not 0 <= value < MAX_SEQ:
        raise InputError("bad_input", f"`{key}` must be an integer 0..2^53")
    return value


def parse_input(data: str | bytes) -> InputEvent:
    """One data-channel message as a typed event, or InputError with a code and message."""
    return parse_message(data)[0]


def parse_message(data: str | bytes) -> tuple[InputEvent, int | None]:
    """The typed event and its `seq` (the page's input counter, None where absent): each frame's
    timing record names the newest input it shows, for input-to-photon figures."""
    try:
        doc = read_json(data, INPUT_JSON)  # `too_large` over 2 KiB of UTF-8, else `bad_json`
    except ProtocolError as exc:
        raise InputError(exc.code, f"input {exc.message}") from None
    if not isinstance(doc, dict):
        raise InputError("bad_input", "input message must be a JSON object")
    kind = doc.get("type")
    parser = _PARSERS.get(kind) if isinstance(kind, str) else None
    if parser is None:
        raise InputError(
            "unknown_type", f"unknown input type {kind!r}; known: {', '.join(INPUT_TYPES)}"
        )
    return parser(doc), (_seq(doc, "seq") if "seq" in doc else None)
