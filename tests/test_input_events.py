import json

import pytest

from render_server.worker.input_events import (
    BlurEvent,
    InputError,
    KeyEvent,
    PointerEvent,
    TouchEvent,
    TouchPoint,
    WheelEvent,
    parse_input,
)


def ev(**fields: object) -> str:
    return json.dumps(fields)


def test_parses_every_input_type() -> None:
    assert parse_input(
        ev(type="pointer", action="move", x=0.5, y=0.25, dx=0.01, dy=-0.02, buttons=1, shift=True)
    ) == PointerEvent("move", 0.5, 0.25, 0.01, -0.02, 1, True)
    assert parse_input(ev(type="wheel", dy=-120)) == WheelEvent(-120.0)
    assert parse_input(ev(type="key", action="down", code="KeyW")) == KeyEvent("down", "KeyW")
    assert parse_input(
        ev(type="touch", action="move", touches=[{"id": 3, "x": 0.1, "y": 0.2}])
    ) == TouchEvent("move", (TouchPoint(3, 0.1, 0.2),))
    assert parse_input(ev(type="blur")) == BlurEvent()


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("nope", "bad_json"),
        ("[]", "bad_input"),
        (ev(type="teleport"), "unknown_type"),
        (ev(type="pointer", action="jump"), "bad_input"),
        (ev(type="pointer", action="move", dx=1e9), "bad_input"),
        (ev(type="pointer", action="move", dx="1"), "bad_input"),
        (ev(type="pointer", action="move", buttons=-1), "bad_input"),
        (ev(type="pointer", action="move", shift="yes"), "bad_input"),
        (ev(type="wheel"), "bad_input"),
        (ev(type="wheel", dy=True), "bad_input"),
        (ev(type="key", action="down", code=""), "bad_input"),
        (ev(type="key", action="down", code="K" * 100), "bad_input"),
        (ev(type="touch", action="move", touches=[{"id": "a", "x": 0, "y": 0}]), "bad_input"),
        (
            ev(type="touch", action="move", touches=[{"id": i, "x": 0, "y": 0} for i in range(11)]),
            "bad_input",
        ),
        (ev(type="wheel", dy=1, pad="x" * 4000), "too_large"),
    ],
)
def test_rejects_bad_input(text: str, code: str) -> None:
    with pytest.raises(InputError) as info:
        parse_input(text)
    assert info.value.code == code


def test_nan_literal_is_refused_even_if_a_parser_accepts_it() -> None:
    # Python's json accepts the NaN token; the validator must still refuse the value
    with pytest.raises(InputError):
        parse_input('{"type": "wheel", "dy": NaN}')
