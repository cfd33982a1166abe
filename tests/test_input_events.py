import json

import pytest

from render_server.protocol.data_channel import (
    BlurEvent,
    CommandError,
    GamepadEvent,
    InputError,
    KeyEvent,
    KeyframeRequest,
    PointerEvent,
    QualityRequest,
    SceneCommand,
    TouchEvent,
    TouchPoint,
    WheelEvent,
    event_type,
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


def test_parses_the_channels_requests() -> None:
    assert parse_input(
        ev(type="pointer", action="move", dx=0.01, dy=0, buttons=0, locked=True)
    ) == PointerEvent("move", 0.0, 0.0, 0.01, 0.0, 0, False, True)
    assert parse_input(ev(type="pointer", action="move")).locked is False
    assert parse_input(ev(type="gamepad", axes=[0.5, -1, 0, 0.2], buttons=[0, 1, 0.25])) == (
        GamepadEvent((0.5, -1.0, 0.0, 0.2), (0.0, 1.0, 0.25))
    )
    assert parse_input(ev(type="gamepad")) == GamepadEvent((), ())
    assert parse_input(
        ev(type="quality", width=1280, height=720.5, fps=60, maxKbps=2500)
    ) == QualityRequest(1280, 720, 60.0, 2500.0)
    assert parse_input(ev(type="quality", fps=24)) == QualityRequest(None, None, 24.0, None)
    assert parse_input(ev(type="quality")) == QualityRequest()
    assert parse_input(ev(type="keyframe")) == KeyframeRequest()
    assert parse_input(
        ev(type="command", id=7, name="setVisible", args={"object": "a", "visible": False})
    ) == SceneCommand("setVisible", {"object": "a", "visible": False}, 7)
    assert parse_input(ev(type="command", name="listScene")) == SceneCommand("listScene", {})
    assert [event_type(parse_input(ev(type=t))) for t in ("blur", "keyframe", "quality")] == [
        "blur",
        "keyframe",
        "quality",
    ]


@pytest.mark.parametrize(
    "fields",
    [
        {"type": "pointer", "action": "move", "locked": 1},
        {"type": "gamepad", "axes": [0.0] * 9},
        {"type": "gamepad", "axes": [1.5]},
        {"type": "gamepad", "axes": ["0"]},
        {"type": "gamepad", "axes": [True]},
        {"type": "gamepad", "axes": {"0": 1}},
        {"type": "gamepad", "buttons": [0.0] * 33},
        {"type": "gamepad", "buttons": [-0.5]},
        {"type": "quality", "width": 1280},
        {"type": "quality", "height": 720},
        {"type": "quality", "width": 0, "height": 720},
        {"type": "quality", "width": -1280, "height": 720},
        {"type": "quality", "width": 1e9, "height": 720},
        {"type": "quality", "width": "1280", "height": 720},
        {"type": "quality", "fps": 0},
        {"type": "quality", "fps": True},
        {"type": "quality", "maxKbps": -5},
    ],
)
def test_rejects_bad_requests(fields: dict[str, object]) -> None:
    with pytest.raises(InputError) as info:
        parse_input(json.dumps(fields))
    assert info.value.code == "bad_input"


def test_nan_in_a_gamepad_state_is_refused() -> None:
    with pytest.raises(InputError):
        parse_input('{"type": "gamepad", "axes": [NaN]}')


@pytest.mark.parametrize(
    ("fields", "id"),
    [
        ({"id": -1, "name": "getCamera"}, None),
        ({"id": 2**31, "name": "getCamera"}, None),
        ({"id": "7", "name": "getCamera"}, None),
        ({"id": True, "name": "getCamera"}, None),
        ({"id": 3}, 3),
        ({"id": 3, "name": ""}, 3),
        ({"id": 3, "name": "x" * 65}, 3),
        ({"id": 3, "name": 5}, 3),
        ({"id": 4, "name": "setVisible", "args": [1]}, 4),
        ({"name": "setVisible", "args": "object=a"}, None),
    ],
)
def test_rejects_bad_commands_with_their_id(fields: dict[str, object], id: int | None) -> None:
    with pytest.raises(CommandError) as info:
        parse_input(json.dumps({"type": "command", **fields}))
    assert info.value.code == "bad_command"
    assert info.value.id == id


def test_a_command_too_large_is_refused() -> None:
    with pytest.raises(InputError) as info:
        parse_input(ev(type="command", name="listScene", args={"pad": "x" * 4000}))
    assert info.value.code == "too_large"
