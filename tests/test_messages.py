import json

import pytest

from render_server.protocol.signaling import (
    MAX_MESSAGE_BYTES,
    Answer,
    Error,
    ErrorCode,
    IceCandidate,
    IceServer,
    Offer,
    ProtocolError,
    SessionEnd,
    SessionStart,
    SessionStarted,
    encode_message,
    parse_client_message,
)


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
