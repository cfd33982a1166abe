"""Whatever a client sends, the parsers answer with a typed message or a coded error."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from render_server.signaling.messages import ProtocolError, parse_client_message
from render_server.worker.input_events import INPUT_TYPES, InputError, parse_input

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
signaling_docs = st.fixed_dictionaries(
    {"v": st.sampled_from([1, 1, 1, 2, "1", None]),
     "type": st.sampled_from(["session.start", "offer", "ice", "session.end", "x"]) | scalars},
    optional={"sdp": values, "candidate": values, "sdpMid": values, "sdpMLineIndex": values},
)  # fmt: skip
input_docs = st.fixed_dictionaries(
    {"type": st.sampled_from(INPUT_TYPES) | scalars},
    optional={k: values for k in ("action", "x", "y", "dx", "dy", "buttons", "shift", "code",
                                  "touches")},
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(st.one_of(signaling_docs.map(json.dumps), st.text(max_size=200), st.binary(max_size=200)))
def test_signaling_parser_never_fails_otherwise(data: str | bytes) -> None:
    try:
        parse_client_message(data)
    except ProtocolError as exc:
        assert exc.code and exc.message


@settings(max_examples=400, deadline=None)
@given(st.one_of(input_docs.map(json.dumps), st.text(max_size=200), st.binary(max_size=200)))
def test_input_parser_never_fails_otherwise(data: str | bytes) -> None:
    try:
        parse_input(data)
    except InputError as exc:
        assert exc.code and exc.message
