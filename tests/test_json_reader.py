"""The one JSON reader of every edge (`protocol/json_reader.py`) and the limits each edge gives it:
a document exactly at a limit passes, one past it is refused with a code, and nothing that
arrives raises anything but ProtocolError."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from render_server.protocol.bus import BUS_JSON, decode_bus_message, parse_worker_request, to_bus
from render_server.protocol.data_channel import INPUT_JSON, MAX_INPUT_BYTES, parse_message
from render_server.protocol.errors import ProtocolError
from render_server.protocol.json_reader import JsonLimits, read_json
from render_server.protocol.signaling import IceServer, parse_client_message
from render_server.protocol.wire import (
    MAX_MESSAGE_BYTES,
    RELAYED_JSON,
    SOCKET_JSON,
    encode_message,
)
from render_server.protocol.worker import OpenSession, SessionOffer, parse_to_worker

LIMITS = JsonLimits(max_bytes=1000, max_depth=3, max_items=10)


def code_of(data: str | bytes, limits: JsonLimits = LIMITS) -> str:
    with pytest.raises(ProtocolError) as info:
        read_json(data, limits)
    return info.value.code


# -- depth and elements ----------------------------------------------------------------------------


@pytest.mark.parametrize("opener", ["[", '{"k":'])
def test_nesting_exactly_at_the_depth_limit_passes_one_more_is_refused(opener: str) -> None:
    closer = "]" if opener == "[" else "}"
    assert read_json(opener * 3 + "0" + closer * 3, LIMITS) is not None
    assert code_of(opener * 4 + "0" + closer * 4) == "bad_json"
    assert read_json('[{"k": [0]}]', LIMITS) == [{"k": [0]}]  # mixed: 3 levels
    assert code_of('[{"k": [[0]]}]') == "bad_json"


def test_elements_exactly_at_the_limit_pass_one_more_is_refused() -> None:
    # an array or object opened counts one, each comma one more
    assert read_json("[" + ",".join("0" * 10) + "]", LIMITS) == [0] * 10
    assert code_of("[" + ",".join("0" * 11) + "]") == "bad_json"
    assert read_json('{"a": [0, 0], "b": {"c": 0}}', LIMITS)  # 3 opened + 2 commas
    assert code_of("[" * 3 + "]" * 3 + ",[]" * 8) == "bad_json"


def test_thousands_of_brackets_are_refused_before_json_recurses() -> None:
    for text in ("[" * 100_000 + "]" * 100_000, '{"a":' * 50_000 + "0" + "}" * 50_000):
        assert code_of(text, JsonLimits(10**7)) == "bad_json"  # never a RecursionError


def test_more_closed_than_opened_is_refused_without_a_scan() -> None:
    assert code_of("]" * 900) == "bad_json"


# -- strings -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        r'"[[[[,,,,{{{{"',  # structure inside a string is no structure
        r'["\"[[[[", "]]]]\""]',  # escaped quotes do not end the string
        r'["\\", "[[[["]',  # an escaped backslash does not escape the quote after it
        r'"\\\"[[[[\\"',
        r'"\u005b\u005b\u005b\u005b"',  # escaped brackets are characters
    ],
)
def test_brackets_quotes_and_commas_inside_strings_do_not_count(text: str) -> None:
    assert read_json(text, JsonLimits(1000, max_depth=1, max_items=2)) == json.loads(text)


def test_a_string_escape_that_ends_the_string_too_early_is_seen() -> None:
    # `"\\"` is a whole string: the brackets after it count
    assert code_of(r'["\\", [[[0]]]]') == "bad_json"


@pytest.mark.parametrize(
    "text", ['"abc', '["abc]', '"\\"', '"\\', '["a", "b\\"]', '"' + '\\"' * 400]
)
def test_unterminated_strings_are_refused(text: str) -> None:
    assert code_of(text) == "bad_json"


def test_quotes_and_backslashes_cost_linear_time() -> None:
    worst = ['"' * 65_000, '"' + "\\" * 64_998 + '"', 'x"\\"' * 16_000 + "\\", '"' + '\\"' * 32_000]
    for text in worst:
        started = time.perf_counter()
        with pytest.raises(ProtocolError):
            read_json(text + "[", SOCKET_JSON)
        assert time.perf_counter() - started < 0.5, text[:20]  # quadratic would take minutes


# -- UTF-8, sizes, numbers ---------------------------------------------------------------------


def test_size_is_counted_in_utf8_bytes_and_exactly_the_limit_passes() -> None:
    limits = JsonLimits(max_bytes=12)
    at_limit = '"' + "é" * 5 + '"'  # 7 characters, 12 bytes
    assert read_json(at_limit, limits) == "é" * 5
    assert read_json(at_limit.encode(), limits) == "é" * 5
    over = '"' + "é" * 5 + 'a"'  # 8 characters, 13 bytes
    assert code_of(over, limits) == "too_large"
    assert code_of(over.encode(), limits) == "too_large"
    assert code_of('"' + "😀" * 3 + '"', JsonLimits(max_bytes=13)) == "too_large"  # 14 bytes


@pytest.mark.parametrize(
    "data", [b'"\xff"', b'{"a": "\xc3\x28"}', b'"\xed\xa0\x80"', b'"\xf4\x90\x80\x80"', b"\x80"]
)
def test_bytes_that_are_not_utf8_are_refused(data: bytes) -> None:
    assert code_of(data) == "bad_json"


def test_unpaired_surrogates_are_refused_a_pair_passes() -> None:
    for text in (r'"\ud800"', r'{"\udc00": 1}', r'["\udc00\ud800"]', '"\ud800"'):
        assert code_of(text) == "bad_json", text
    assert read_json(r'"\ud83d\ude00"', LIMITS) == "😀"
    assert read_json(r'"\\ud800"', LIMITS) == "\\ud800"  # an escaped backslash, then text


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999", "-1e400"])
def test_nan_infinity_and_numbers_beyond_a_float_are_refused(number: str) -> None:
    assert code_of(f"[{number}]") == "bad_json"
    assert read_json("[1e308, -1e-400, 12345678901234567890]", LIMITS) == [
        1e308,
        -0.0,
        12345678901234567890,
    ]


@pytest.mark.parametrize("digits", [309, 400])
def test_a_float_too_large_without_an_exponent_is_refused(digits: int) -> None:
    zeros, nines = "0" * (digits - 1), "9" * digits
    assert code_of(f"[2{zeros}.5]") == "bad_json"  # 2e308 and more: beyond 1.8e308
    assert code_of(f'{{"a": "x", "b": -{nines}.0}}') == "bad_json"


def test_floats_read_alike_with_and_without_an_exponent_in_the_text() -> None:
    near_max = f"{'9' * 308}.0"  # the longest integral part a float holds
    plain = read_json(f"[{near_max}, 0.1, -2.5]", LIMITS)
    assert plain == [float(near_max), 0.1, -2.5]
    # "1e999" in a string makes the text take the hooked decoder: no number is refused for it
    assert read_json(f'["1e999", {near_max}, 0.1, -2.5]', LIMITS) == ["1e999", *plain]


def test_an_integer_of_thousands_of_digits_is_refused() -> None:
    assert code_of("1" * 5000, JsonLimits(10_000)) == "bad_json"


values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(values, st.booleans())
def test_a_document_within_the_limits_reads_as_json_reads_it(value: Any, ascii: bool) -> None:
    text = json.dumps(value, ensure_ascii=ascii)
    assert read_json(text, JsonLimits(10**6, 64, 10**5)) == json.loads(text)


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet='[]{},:"\\ 0a\u00e9', max_size=300) | st.binary(max_size=300))
def test_anything_is_a_value_or_a_coded_error(data: str | bytes) -> None:
    try:
        read_json(data, LIMITS)
    except ProtocolError as exc:
        assert exc.code in ("bad_json", "too_large")


# -- the limits of each edge -------------------------------------------------------------------


def input_messages() -> list[dict[str, Any]]:
    """The largest message of each kind docs/data-channel.md describes."""
    touch = [{"id": i, "x": 0.123456789, "y": -0.987654321} for i in range(10)]
    return [
        {"type": "pointer", "action": "move", "x": 0.52, "y": 0.31, "dx": 0.004, "dy": -0.002,
         "buttons": 1, "shift": False, "locked": False, "seq": 2**53 - 1},
        {"type": "wheel", "dy": -100, "seq": 1},
        {"type": "key", "action": "down", "code": "K" * 32, "seq": 1},
        {"type": "touch", "action": "move", "touches": touch, "seq": 2**53 - 1},
        {"type": "blur"},
        {"type": "gamepad", "axes": [-0.123456789] * 8, "buttons": [0.123456789] * 32,
         "seq": 2**53 - 1},
        {"type": "quality", "width": 100_000, "height": 100_000, "fps": 1000, "maxKbps": 1e7},
        {"type": "keyframe"},
        {"type": "command", "id": 2**31 - 1, "name": "setCamera",
         "args": {"yaw": 1.0, "pitch": 0.5, "distance": 7.9, "target": [1e6, -1e6, 0.5]}},
        {"type": "command", "id": 17, "name": "setMaterial",
         "args": {"material": "m" * 64, "color": "#20c040", "roughness": 0.5, "metallic": 1}},
        {"type": "ping", "id": 2**53 - 1, "t": 18234.52},
    ]  # fmt: skip


@pytest.mark.parametrize("message", input_messages(), ids=lambda m: str(m["type"]))
def test_every_documented_input_message_fits_the_data_channel_limits(
    message: dict[str, Any],
) -> None:
    text = json.dumps(message)
    assert len(text) <= MAX_INPUT_BYTES
    read_json(text, INPUT_JSON)
    parse_message(text)


def test_the_data_channel_refuses_two_kib_of_nesting_or_elements() -> None:
    for text in (
        "[" * 1024 + "]" * 1024,
        "[" + "0," * 1000 + "0]",
        '{"type": "blur", "x": [[[[0]]]]}',
    ):
        with pytest.raises(Exception) as info:
            parse_message(text)
        assert getattr(info.value, "code", None) == "bad_json", text[:40]
    too_large = json.dumps({"type": "key", "action": "down", "code": "é" * 1100})  # 2.2 KB
    with pytest.raises(Exception) as info:
        parse_message(too_large)
    assert getattr(info.value, "code", None) == "too_large"


def test_a_socket_message_at_its_size_limit_passes_and_relays_within_the_bus_limits() -> None:
    # an offer of 64 KiB whose SDP is all 2-byte characters: escaped, it triples on the way on
    envelope = {"v": 1, "type": "offer", "sdp": "v=0"}
    room = MAX_MESSAGE_BYTES - len(json.dumps(envelope).encode())
    sdp = "v=0" + "é" * (room // 2)
    text = json.dumps({**envelope, "sdp": sdp}, ensure_ascii=False)
    assert MAX_MESSAGE_BYTES - 1 <= len(text.encode()) <= MAX_MESSAGE_BYTES
    parse_client_message(text)
    relayed = SessionOffer("a" * 32, sdp)
    assert len(encode_message(relayed)) > 2.5 * MAX_MESSAGE_BYTES
    assert parse_to_worker(encode_message(relayed)) == relayed
    on_the_bus = json.dumps(to_bus(relayed))
    assert parse_worker_request(decode_bus_message(on_the_bus)) == relayed
    assert RELAYED_JSON.max_bytes == BUS_JSON.max_bytes
    with pytest.raises(ProtocolError) as info:
        parse_client_message(text + "  ")
    assert info.value.code == "too_large"


def test_the_deepest_worker_request_fits_the_bus_limits() -> None:
    request = OpenSession("a" * 32, "viewer", [IceServer(["turn:x"] * 8, "u", "c")] * 4)
    assert parse_worker_request(decode_bus_message(json.dumps(to_bus(request)))) == request
    assert parse_to_worker(encode_message(request)) == request
    for bad in ("[" * 9 + "]" * 9, "[1]", '"x"', '{"a": NaN}'):
        with pytest.raises(ProtocolError):
            decode_bus_message(bad)
