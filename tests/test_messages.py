import json
import logging
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from render_server.protocol.bus import (
    Assigned,
    BusMessage,
    EndRequested,
    QueueChanged,
    Resumed,
    SessionNews,
    WorkerLost,
    parse_queue_news,
    parse_session_news,
    parse_worker_request,
    to_bus,
)
from render_server.protocol.errors import ErrorCode, ProtocolError
from render_server.protocol.signaling import (
    Answer,
    Error,
    IceCandidate,
    IceServer,
    Offer,
    SessionEnd,
    SessionStart,
    SessionStarted,
    parse_client_message,
)
from render_server.protocol.wire import MAX_MESSAGE_BYTES, NAME, encode_message
from render_server.protocol.worker import (
    ROLES,
    CloseSession,
    OpenSession,
    SessionIce,
    SessionOffer,
    SessionOpened,
    SessionReply,
    SessionRequest,
    WorkerAnswer,
    WorkerError,
    WorkerSessionEnded,
    parse_from_worker,
    parse_to_worker,
)
from render_server.signaling.channels import Channels, browser_channel
from render_server.signaling.state.bus import MemoryBus

from .support import eventually_async


def msg(**fields: object) -> str:
    return json.dumps({"v": 1, **fields})


def test_parses_each_client_message() -> None:
    assert parse_client_message(msg(type="session.start")) == SessionStart()
    assert parse_client_message(msg(type="offer", sdp="v=0\r\n...")) == Offer(sdp="v=0\r\n...")
    ice = parse_client_message(
        msg(
            type="ice",
            candidate="candidate:1 1 udp 1 1.2.3.4 5 typ host",
            sdpMid="0",
            sdpMLineIndex=0,
        )
    )
    assert ice == IceCandidate("candidate:1 1 udp 1 1.2.3.4 5 typ host", "0", 0)
    assert parse_client_message(msg(type="ice", candidate="")) == IceCandidate("")
    assert parse_client_message(msg(type="session.end")) == SessionEnd()


def test_unknown_fields_are_ignored_for_forward_compatibility() -> None:
    assert parse_client_message(msg(type="session.start", future="x")) == SessionStart()


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("{not json", ErrorCode.BAD_JSON),
        ("[1, 2]", ErrorCode.BAD_MESSAGE),
        (json.dumps({"type": "offer", "sdp": "v=0"}), ErrorCode.UNSUPPORTED_VERSION),
        (msg(v=2, type="offer"), ErrorCode.UNSUPPORTED_VERSION),
        (msg(type="launch.missiles"), ErrorCode.UNKNOWN_TYPE),
        (msg(type=7), ErrorCode.UNKNOWN_TYPE),
        (msg(type="offer"), ErrorCode.BAD_MESSAGE),
        (msg(type="offer", sdp=42), ErrorCode.BAD_MESSAGE),
        (msg(type="offer", sdp="hello"), ErrorCode.BAD_MESSAGE),
        (msg(type="ice", candidate="rm -rf /"), ErrorCode.BAD_MESSAGE),
        (msg(type="ice", candidate="candidate:1", sdpMLineIndex="0"), ErrorCode.BAD_MESSAGE),
        (msg(type="ice", candidate="candidate:1", sdpMLineIndex=True), ErrorCode.BAD_MESSAGE),
        (msg(type="ice", candidate="candidate:" + "x" * 2000), ErrorCode.TOO_LARGE),
        (msg(type="offer", sdp="v=0" + "x" * MAX_MESSAGE_BYTES), ErrorCode.TOO_LARGE),
    ],
)
def test_rejects_malformed_messages_with_a_code(text: str, code: str) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_client_message(text)
    assert info.value.code == code
    assert info.value.message  # a human explanation


def test_server_messages_use_the_browser_spelling() -> None:
    started = json.loads(
        encode_message(
            SessionStarted(
                "abc",
                "w1",
                1280,
                720,
                30.0,
                "H264",
                resume_token="r" * 16,
                ice_servers=[IceServer(urls=["stun:x"])],
            )
        )
    )
    assert started == {
        "v": 1,
        "type": "session.started",
        "sessionId": "abc",
        "workerId": "w1",
        "width": 1280,
        "height": 720,
        "fps": 30.0,
        "codec": "H264",
        "role": "controller",
        "resumeToken": "r" * 16,
        "iceServers": [{"urls": ["stun:x"]}],
    }
    assert json.loads(encode_message(Answer("v=0"))) == {"v": 1, "type": "answer", "sdp": "v=0"}
    assert json.loads(encode_message(Error("bad_json", "no"))) == {
        "v": 1,
        "type": "error",
        "code": "bad_json",
        "message": "no",
    }


# -- the worker's protocol and the bus between replicas ------------------------------------------

SESSION_IDS = st.text("0123456789abcdef", min_size=32, max_size=32)
REASONS = st.text(max_size=64)
NAMES = st.from_regex(NAME, fullmatch=True)
SDPS = st.text(max_size=80).map(lambda s: "v=0" + s)
OPTIONAL_TEXT = st.none() | st.text(max_size=40)
ICE_SERVERS = st.builds(
    IceServer,
    urls=st.lists(st.text(max_size=40), max_size=8),
    username=OPTIONAL_TEXT,
    credential=OPTIONAL_TEXT,
)
CANDIDATES = st.just("") | st.text(max_size=60).map(lambda s: "candidate:" + s)

SESSION_REPLIES = st.one_of(
    st.builds(
        SessionOpened,
        SESSION_IDS,
        st.integers(0, 16384),
        st.integers(0, 16384),
        st.floats(0, 1000),
        NAMES,
    ),
    st.builds(WorkerAnswer, SESSION_IDS, SDPS),
    st.builds(WorkerError, SESSION_IDS, REASONS, st.text(max_size=500)),
    st.builds(WorkerSessionEnded, SESSION_IDS, REASONS),
)
SESSION_NEWS = st.one_of(
    st.builds(Assigned, SESSION_IDS, st.text(min_size=1, max_size=256)),
    st.builds(WorkerLost, SESSION_IDS, REASONS),
    st.builds(Resumed, st.integers(1, 2**53)),
    st.builds(EndRequested, REASONS),
    SESSION_REPLIES,
)
SESSION_REQUESTS = st.one_of(
    st.builds(OpenSession, SESSION_IDS, st.sampled_from(ROLES), st.lists(ICE_SERVERS, max_size=3)),
    st.builds(SessionOffer, SESSION_IDS, SDPS),
    st.builds(
        SessionIce,
        SESSION_IDS,
        CANDIDATES,
        st.none() | st.text(max_size=64),
        st.none() | st.integers(0, 63),
    ),
    st.builds(CloseSession, SESSION_IDS, REASONS),
)


def over_the_bus(message: BusMessage) -> object:
    """The message as a peer receives it: JSON text in between, as on Redis."""
    return json.loads(json.dumps(to_bus(message)))


@given(SESSION_NEWS)
def test_session_news_round_trip(news: SessionNews) -> None:
    assert parse_session_news(over_the_bus(news)) == news


@given(SESSION_REQUESTS)
def test_session_requests_round_trip_on_the_bus_and_the_socket(asked: SessionRequest) -> None:
    assert parse_worker_request(over_the_bus(asked)) == asked
    assert parse_to_worker(encode_message(asked)) == asked  # as the worker's socket reads it


@given(SESSION_REPLIES)
def test_session_replies_round_trip_on_the_socket(reply: SessionReply) -> None:
    assert parse_from_worker(encode_message(reply)) == reply


def test_queue_changed_round_trip() -> None:
    assert parse_queue_news(over_the_bus(QueueChanged())) == QueueChanged()


def test_bus_documents_keep_their_shape() -> None:
    """What replicas published before these types: a rolling upgrade mixes both."""
    sid = "0" * 32
    assert to_bus(Assigned(sid, "w1")) == {
        "v": 1, "type": "assigned", "sessionId": sid, "workerId": "w1"
    }  # fmt: skip
    assert to_bus(WorkerLost(sid, "heartbeat_timeout")) == {
        "v": 1, "type": "worker_lost", "sessionId": sid, "reason": "heartbeat_timeout"
    }  # fmt: skip
    assert to_bus(Resumed(2)) == {"v": 1, "type": "resumed", "generation": 2}
    assert to_bus(EndRequested("ended_by_api")) == {
        "v": 1, "type": "end.requested", "reason": "ended_by_api"
    }  # fmt: skip
    assert to_bus(QueueChanged()) == {"v": 1, "type": "queue.changed"}
    # an older replica's documents carry no `v`: read as this version
    assert parse_session_news({"type": "resumed", "generation": 3}) == Resumed(3)
    assert parse_queue_news({"type": "queue.changed"}) == QueueChanged()


@pytest.mark.parametrize(
    ("parse", "doc", "code"),
    [
        (parse_session_news, [1, 2], ErrorCode.BAD_MESSAGE),
        (parse_session_news, "assigned", ErrorCode.BAD_MESSAGE),
        (parse_session_news, {"v": 2, "type": "resumed", "generation": 2}, "unsupported_version"),
        (parse_session_news, {"type": "nonsense"}, ErrorCode.UNKNOWN_TYPE),
        (parse_session_news, {"type": "queue.changed"}, ErrorCode.UNKNOWN_TYPE),  # wrong channel
        (parse_session_news, {"type": "session.open", "sessionId": "0" * 32}, "unknown_type"),
        (parse_session_news, {"type": "assigned", "sessionId": "0" * 32}, ErrorCode.BAD_MESSAGE),
        (parse_session_news, {"type": "assigned", "sessionId": "x", "workerId": "w"},
         ErrorCode.BAD_MESSAGE),
        (
            parse_session_news,
            {"type": "assigned", "sessionId": "0" * 32, "workerId": ""},
            ErrorCode.BAD_MESSAGE,
        ),
        (parse_session_news, {"type": "resumed", "generation": "2"}, ErrorCode.BAD_MESSAGE),
        (parse_session_news, {"type": "resumed", "generation": True}, ErrorCode.BAD_MESSAGE),
        (parse_session_news, {"type": "resumed", "generation": 0}, ErrorCode.BAD_MESSAGE),
        (parse_session_news, {"type": "end.requested", "reason": 7}, ErrorCode.BAD_MESSAGE),
        (parse_session_news, {"type": "end.requested", "reason": "x" * 65}, ErrorCode.TOO_LARGE),
        (
            parse_session_news,
            {"type": "session.opened", "sessionId": "0" * 32, "codec": "H264", "fps": "30"},
            ErrorCode.BAD_MESSAGE,
        ),
        (parse_session_news, {"type": "answer", "sessionId": "0" * 32, "sdp": "hi"}, "bad_message"),
        (parse_queue_news, {"type": "assigned"}, ErrorCode.UNKNOWN_TYPE),
        (parse_queue_news, None, ErrorCode.BAD_MESSAGE),
        (parse_worker_request, {"type": "worker.registered", "workerId": "w"}, "unknown_type"),
        (parse_worker_request, {"type": "session.open", "sessionId": "0" * 32, "role": "god"},
         ErrorCode.BAD_MESSAGE),
        (parse_worker_request, {"type": "session.open", "sessionId": "0" * 32,
                                 "iceServers": [{"urls": ["stun:x"], "username": 5}]},
         ErrorCode.BAD_MESSAGE),
        (parse_worker_request, {"type": "session.close", "sessionId": "0" * 32},
         ErrorCode.BAD_MESSAGE),
    ],
)  # fmt: skip
def test_malformed_bus_messages_are_refused_with_a_code(
    parse: Callable[[object], object], doc: object, code: str
) -> None:
    with pytest.raises(ProtocolError) as info:
        parse(doc)
    assert info.value.code == code
    assert info.value.message


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=10,
)
BUS_DOCS = st.fixed_dictionaries(
    {"type": st.sampled_from(["assigned", "worker_lost", "resumed", "end.requested",
                              "queue.changed", "session.opened", "answer", "error",
                              "session.ended", "session.open", "offer", "ice", "session.close"])},
    optional={k: JSON_VALUES for k in ("v", "sessionId", "workerId", "reason", "generation",
                                       "sdp", "code", "message", "width", "fps", "codec", "role",
                                       "iceServers", "candidate", "sdpMLineIndex")},
)  # fmt: skip


@settings(max_examples=300)
@given(st.one_of(BUS_DOCS, JSON_VALUES))
def test_bus_parsers_answer_anything_with_a_message_or_a_coded_error(doc: object) -> None:
    for parse in (parse_session_news, parse_queue_news, parse_worker_request):
        try:
            parse(doc)
        except ProtocolError as exc:
            assert exc.code and exc.message


async def test_a_malformed_bus_message_is_logged_and_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bus = MemoryBus()
    channels = Channels(bus)
    got: list[SessionNews] = []

    async def record(news: SessionNews) -> None:
        got.append(news)

    sid = "0" * 32
    await channels.on_session(sid, record)
    with caplog.at_level(logging.WARNING, logger="render_server.signaling.channels"):
        await bus.publish(browser_channel(sid), {"type": "assigned", "sessionId": sid})
        await bus.publish(browser_channel(sid), {"type": "launch.missiles"})
        await channels.to_session(sid, Resumed(2))
        await eventually_async(lambda: got, 10, 0.01, what="the well-formed message")
    await channels.close()
    assert got == [Resumed(2)]
    bad = [r for r in caplog.records if r.getMessage() == "bus.bad_message"]
    assert [r.__dict__["code"] for r in bad] == [ErrorCode.BAD_MESSAGE, ErrorCode.UNKNOWN_TYPE]
