"""The HTTP edge under attack, against a real `render-server serve` process: cross-site and
DNS-rebinding requests to the REST API, hostile bodies, connections that never finish or
never leave, connection hoarding, garbage HTTP.

The servers get the new limits from RENDER_SERVER_* variables rather than flags, so that the
same tests run against a server that predates them (and fail there on the behaviour).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from render_server.cli.main import build_parser
from render_server.cli.options import server_config
from render_server.config import ConfigError, ServerConfig
from render_server.tools.local_server import local_server

from .processes import SECRET, token
from .support import eventually, eventually_async, fleet_figures, receive

SMALL = ("--renderer", "cpu", "--encoder", "x264", "--resolution", "64x64", "--fps", "5",
         "--slots", "4")  # fmt: skip
ALLOWED = "https://app.example"
HEADER_TIMEOUT_S = 1.0
KEEPALIVE_TIMEOUT_S = 1.5
CAP = 4


def limits_env(**extra: str) -> dict[str, str]:
    return {
        "RENDER_SERVER_HEADER_TIMEOUT": str(HEADER_TIMEOUT_S),
        "RENDER_SERVER_KEEPALIVE_TIMEOUT": str(KEEPALIVE_TIMEOUT_S),
        "RENDER_SERVER_ALLOW_ORIGIN": ALLOWED,
        **extra,
    }


@dataclass(frozen=True)
class Served:
    url: str
    log: Path

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def log_text(self) -> str:
        return self.log.read_text()


@contextlib.contextmanager
def serve(log: Path, *args: str, **env: str) -> Iterator[Served]:
    with local_server(*SMALL, *args, log_path=log, env=limits_env(**env)) as server:
        yield Served(server.url, log)


@pytest.fixture(scope="module")
def open_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """`serve` on loopback with auth off: no token stops a request, only the edge does."""
    with serve(tmp_path_factory.mktemp("edge") / "serve.log", "--auth", "off") as server:
        yield server


@pytest.fixture(scope="module")
def secured_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    log = tmp_path_factory.mktemp("secured") / "serve.log"
    with serve(log, "--auth", "on", RENDER_SERVER_SECRET=SECRET) as server:
        yield server


@pytest.fixture
def capped_server(tmp_path: Path) -> Iterator[Served]:
    with serve(
        tmp_path / "serve.log", "--auth", "off",
        RENDER_SERVER_MAX_CONNECTIONS_PER_ADDRESS=str(CAP),
        RENDER_SERVER_TRUSTED_PROXY="127.0.0.0/8",
        RENDER_SERVER_HEADER_TIMEOUT="30",  # the hoarded connections are not timed out here
    ) as server:  # fmt: skip
        yield server


async def http_json(
    method: str, url: str, headers: dict[str, str] | None = None, data: Any = None
) -> tuple[int, dict[str, str], Any]:
    async with aiohttp.ClientSession() as http:
        async with http.request(method, url, headers=headers or {}, data=data) as response:
            body = await response.read()
            try:
                doc = json.loads(body) if body else None
            except ValueError:
                doc = body.decode(errors="replace")
            return response.status, dict(response.headers), doc


async def free_slots(server: Served) -> int:
    status, _, doc = await http_json("GET", server.url + "/metrics")
    assert status == 200
    return fleet_figures(str(doc))["free"]


async def create_session(server: Served, headers: dict[str, str] | None = None) -> str:
    headers = {"Content-Type": "application/json", **(headers or {})}
    status, _, doc = await http_json("POST", server.url + "/api/sessions", headers, b"{}")
    assert status == 201, doc
    return str(doc["sessionId"])


async def end_session(server: Served, sid: str, headers: dict[str, str] | None = None) -> None:
    status, _, doc = await http_json("DELETE", f"{server.url}/api/sessions/{sid}", headers)
    assert status == 202, doc


# -- raw connections -------------------------------------------------------------------------


async def connect(server: Served) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", server.port)


async def seconds_until_closed(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    limit: float,
    dribble: bytes = b"",
    every: float = 0.2,
) -> float | None:
    """How long the server kept the connection open (None: still open after `limit`), reading
    and discarding what it sends, writing `dribble` every `every` seconds."""
    start = time.monotonic()
    while time.monotonic() - start < limit:
        try:
            if dribble:
                writer.write(dribble)
                await writer.drain()
            if await asyncio.wait_for(reader.read(65536), every) == b"":
                return time.monotonic() - start
        except TimeoutError:
            continue
        except ConnectionError:
            return time.monotonic() - start
    return None


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    lines = head.decode("latin-1").split("\r\n")
    length = next(
        (int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length")),
        0,
    )
    body = await asyncio.wait_for(reader.readexactly(length), 5) if length else b""
    return int(lines[0].split()[1]), body


def request(path: str = "/healthz", host: str = "127.0.0.1") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()


# -- REST bodies -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("text/plain", b'{"requirements": {}}'),  # what a cross-site fetch() sends unasked
        ("text/plain;charset=UTF-8", b"{}"),
        ("application/x-www-form-urlencoded", b"requirements=%7B%7D"),
        (
            "multipart/form-data; boundary=x",
            b'--x\r\nContent-Disposition: form-data; name="a"\r\n\r\n{}\r\n--x--\r\n',
        ),  # fmt: skip
        (None, b"{}"),  # a body that does not say what it is
    ],
    ids=["text", "text-charset", "form", "multipart", "undeclared"],
)
async def test_a_body_that_is_not_json_is_refused_and_creates_no_session(
    open_server: Served, content_type: str | None, body: bytes
) -> None:
    before = await free_slots(open_server)
    headers = {"Content-Type": content_type} if content_type else {}
    async with aiohttp.ClientSession(skip_auto_headers=("Content-Type",)) as http:
        async with http.post(open_server.url + "/api/sessions", data=body, headers=headers) as r:
            assert r.status == 415, await r.text()
            assert (await r.json())["code"] == "unsupported_media_type"
    await asyncio.sleep(0.3)
    assert await free_slots(open_server) == before


async def test_json_bodies_and_no_body_still_create_sessions(secured_server: Served) -> None:
    headers = {"Authorization": f"Bearer {token('controller', 'jo')}"}
    sid = await create_session(secured_server, headers)
    await end_session(secured_server, sid, headers)
    typed = {**headers, "Content-Type": "application/json; charset=utf-8"}
    status, _, doc = await http_json("POST", secured_server.url + "/api/sessions", typed, b"{}")
    assert status == 201, doc
    await end_session(secured_server, doc["sessionId"], headers)
    status, _, doc = await http_json("POST", secured_server.url + "/api/sessions", headers)
    assert status == 201, doc  # no body at all: an empty object
    await end_session(secured_server, doc["sessionId"], headers)


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 2000 + b"]" * 2000,
        b'{"requirements": ' + b'{"a":' * 600 + b"1" + b"}" * 601,
    ],
    ids=["arrays", "objects"],
)
async def test_a_deeply_nested_body_is_bad_json_not_a_500(
    secured_server: Served, body: bytes
) -> None:
    assert len(body) <= 4096  # within the size limit: the nesting is what is refused
    headers = {
        "Authorization": f"Bearer {token('controller', 'kit')}",
        "Content-Type": "application/json",
    }
    status, _, doc = await http_json("POST", secured_server.url + "/api/sessions", headers, body)
    assert status == 400, (status, doc)  # not a 500
    assert doc["code"] == "bad_json", doc
    assert "Traceback" not in secured_server.log_text()


# -- Host, Origin, CORS ----------------------------------------------------------------------


async def test_dns_rebinding_is_refused_on_a_loopback_bind(open_server: Served) -> None:
    sid = await create_session(open_server)
    evil = {"Host": f"evil.example:{open_server.port}"}
    json_body = {**evil, "Content-Type": "application/json"}
    answers: dict[str, tuple[int, str | None]] = {}
    for method, path, headers, body in [
        ("GET", "/", evil, None),
        ("GET", "/client/render-stream.js", evil, None),
        ("POST", "/api/sessions", json_body, b"{}"),
        ("GET", f"/api/sessions/{sid}", evil, None),
        ("DELETE", f"/api/sessions/{sid}", evil, None),
        ("GET", "/api/workers", evil, None),
        ("GET", "/metrics", evil, None),
        (
            "GET",
            "/ws",
            {
                **evil,
                "Upgrade": "websocket",
                "Connection": "Upgrade",
                "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
                "Sec-WebSocket-Version": "13",
            },
            None,
        ),  # fmt: skip
    ]:
        status, _, doc = await http_json(method, open_server.url + path, headers, body)
        answers[f"{method} {path}"] = (status, doc.get("code") if isinstance(doc, dict) else None)
    assert all(answer == (403, "origin") for answer in answers.values()), answers
    # HTTP/1.0 without any Host: not a loopback name either
    reader, writer = await connect(open_server)
    writer.write(b"GET /api/workers HTTP/1.0\r\n\r\n")
    assert (await read_response(reader))[0] == 403
    writer.close()
    # the session is untouched, and still reachable by its own name
    status, _, doc = await http_json("GET", f"{open_server.url}/api/sessions/{sid}")
    assert status == 200, doc
    await end_session(open_server, sid)
    await asyncio.sleep(0.2)
    assert "audit.host.refused" in open_server.log_text()


async def test_a_foreign_origin_cannot_change_state(open_server: Served) -> None:
    url = open_server.url + "/api/sessions"
    foreign = {"Origin": "https://evil.example", "Content-Type": "application/json"}
    status, _, doc = await http_json("POST", url, foreign, b"{}")
    assert status == 403, (status, doc)
    assert doc["code"] == "origin", doc
    sid = await create_session(open_server, {"Origin": open_server.url})  # same origin
    status, _, doc = await http_json("DELETE", f"{url}/{sid}", {"Origin": "null"})
    assert status == 403, doc  # a sandboxed frame's (or a redirect's) opaque origin
    status, headers, doc = await http_json(
        "DELETE", f"{url}/{sid}", {"Origin": ALLOWED}
    )  # an allow-listed page may, and may read the answer
    assert status == 202, doc
    assert headers.get("Access-Control-Allow-Origin") == ALLOWED
    assert "Origin" in headers.get("Vary", "")


async def test_cors_preflight_answers_the_allow_list_only(open_server: Served) -> None:
    url = open_server.url + "/api/sessions"
    ask = {"Access-Control-Request-Method": "POST",
           "Access-Control-Request-Headers": "authorization, content-type"}  # fmt: skip
    status, headers, _ = await http_json("OPTIONS", url, {**ask, "Origin": ALLOWED})
    assert status in (200, 204)
    assert headers["Access-Control-Allow-Origin"] == ALLOWED
    assert "POST" in headers["Access-Control-Allow-Methods"]
    allowed_headers = headers["Access-Control-Allow-Headers"].lower()
    assert "authorization" in allowed_headers and "content-type" in allowed_headers
    assert int(headers["Access-Control-Max-Age"]) > 0
    assert "Origin" in headers["Vary"]
    status, headers, _ = await http_json("OPTIONS", url, {**ask, "Origin": "https://evil.example"})
    assert status >= 400 and "Access-Control-Allow-Origin" not in headers
    # actual answers: the allow-listed origin may read them, another may not
    status, headers, _ = await http_json(
        "GET", open_server.url + "/api/workers", {"Origin": ALLOWED}
    )
    assert status == 200 and headers["Access-Control-Allow-Origin"] == ALLOWED
    assert "Origin" in headers["Vary"]
    status, headers, _ = await http_json(
        "GET", open_server.url + "/api/workers", {"Origin": "https://evil.example"}
    )
    assert status == 200 and "Access-Control-Allow-Origin" not in headers
    # the SDK stays public
    status, headers, _ = await http_json("GET", open_server.url + "/client/render-stream.js")
    assert status == 200 and headers["Access-Control-Allow-Origin"] == "*"


# -- connections -----------------------------------------------------------------------------


async def test_slow_and_silent_connections_are_closed(open_server: Served) -> None:
    slow_reader, slow = await connect(open_server)
    slow.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    silent_reader, silent = await connect(open_server)
    slowloris, quiet = await asyncio.gather(
        seconds_until_closed(slow_reader, slow, 5.0, dribble=b"X-Padding: a\r\n"),
        seconds_until_closed(silent_reader, silent, 5.0),
    )
    for name, seconds in (("slowloris", slowloris), ("silent", quiet)):
        assert seconds is not None, f"{name} connection still open after 5 s"
        assert HEADER_TIMEOUT_S * 0.8 <= seconds <= HEADER_TIMEOUT_S + 2.5, (name, seconds)
    slow.close()
    silent.close()
    # meanwhile the server serves
    status, _, _ = await http_json("GET", open_server.url + "/healthz")
    assert status == 200


async def test_an_idle_keep_alive_connection_is_closed(open_server: Served) -> None:
    reader, writer = await connect(open_server)
    for _ in range(2):  # kept alive between requests
        writer.write(request())
        assert (await read_response(reader))[0] == 200
    seconds = await seconds_until_closed(reader, writer, 5.0)
    assert seconds is not None, "idle connection still open after 5 s"
    # the keep-alive timeout, not the header timeout: no request had begun
    assert KEEPALIVE_TIMEOUT_S * 0.85 <= seconds <= KEEPALIVE_TIMEOUT_S + 2.5, seconds
    writer.close()


async def test_a_websocket_outlives_the_header_and_keep_alive_timeouts(
    open_server: Served,
) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(open_server.url + "/ws", autoping=False) as ws:
            await asyncio.sleep(HEADER_TIMEOUT_S + KEEPALIVE_TIMEOUT_S + 0.5)
            await ws.send_str(json.dumps({"v": 1, "type": "nonsense"}))
            reply = await receive(ws, 5)
            assert reply["code"] == "unknown_type"


async def test_the_per_address_cap_refuses_the_connection_over_it(
    capped_server: Served,
) -> None:
    async with aiohttp.ClientSession() as http:
        sockets = [await http.ws_connect(capped_server.url + "/ws") for _ in range(2)]
        raw = [await connect(capped_server) for _ in range(CAP - 2)]  # the cap: sockets count
        over_reader, over = await connect(capped_server)
        seconds = await seconds_until_closed(over_reader, over, 5.0)
        # closed at once: not by the header timeout (30 s here)
        assert seconds is not None and seconds < 5.0, seconds
        for reader, writer in raw:  # the earlier ones work
            writer.write(request())
            assert (await read_response(reader))[0] == 200
        for ws in sockets:
            await ws.send_str(json.dumps({"v": 1, "type": "nonsense"}))
            assert (await receive(ws, 5))["code"] == "unknown_type"
        await sockets.pop().close()  # one leaves: there is room again
        # ... once the server has seen it go: until then a new connection is still refused
        refused_again = 0
        opened: list[asyncio.StreamWriter] = []

        async def served() -> int | None:
            nonlocal refused_again
            reader, writer = await connect(capped_server)
            opened.append(writer)
            writer.write(request())
            try:
                return (await read_response(reader))[0]
            except (asyncio.IncompleteReadError, ConnectionError):  # closed unanswered
                refused_again += 1
                return None

        # every 0.2 s: the log's burst of refusal lines (10) covers 2 s of tries
        assert await eventually_async(served, 10, 0.2, what="room for a new connection") == 200
        for ws in sockets:
            await ws.close()
        for w in [*(w for _, w in raw), *opened, over]:
            w.close()

    def refusals() -> list[str]:
        lines = capped_server.log_text().splitlines()
        return [line for line in lines if "connection.refused" in line]

    # the one over the cap, and any tried before the server saw the room made
    eventually(lambda: len(refusals()) >= 1 + refused_again, 10, what=lambda: str(refusals()))
    assert len(refusals()) == 1 + refused_again, (refused_again, refusals())
    assert all("max_connections_per_address" in line for line in refusals()), refusals()


GARBAGE = [
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(64)),  # TLS on the HTTP port
    b"GARBAGE\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nBad Header\r\n\r\n",
    b"GET / HTTP/9.9\r\nHost: 127.0.0.1\r\n\r\n",
    b"GET /" + b"a" * 10_000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX: " + b"b" * 10_000 + b"\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n\r\n",
    b"POST /api/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n5\r\n{}\r\nnope\r\n",
    b"POST /api/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\n"
    b"Content-Length: 6\r\n\r\n{}",
    b"GET / HTTP/1.1\r\nHost: [\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: 127.0.0.1:notaport\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: http://[\r\n\r\n",
    b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
]


async def test_garbage_http_is_refused_without_a_traceback(open_server: Served) -> None:
    for payload in GARBAGE * 8:  # a flood: the log keeps to a rate
        reader, writer = await connect(open_server)
        writer.write(payload)
        try:
            answer = await asyncio.wait_for(reader.read(64), 5)
        except ConnectionError:
            answer = b""
        assert answer == b"" or answer.startswith(b"HTTP/1."), (payload[:40], answer)
        assert b" 500 " not in answer, payload[:60]
        writer.close()
    status, _, _ = await http_json("GET", open_server.url + "/healthz")
    assert status == 200
    await asyncio.sleep(0.3)
    log = open_server.log_text()
    assert "Traceback" not in log and "ERROR aiohttp" not in log, log[-3000:]
    notices = [line for line in log.splitlines() if "http.bad_request" in line]
    assert 0 < len(notices) < len(GARBAGE) * 4, len(notices)  # at most a short line each, fewer


# -- who the client is -----------------------------------------------------------------------


def test_the_client_behind_a_trusted_proxy_is_read_from_the_right() -> None:
    from render_server.signaling.forwarded import forwarded_client

    trusted = ("10.0.0.0/8", "127.0.0.1/32")
    assert forwarded_client("127.0.0.1", [], ()) == "127.0.0.1"
    # an untrusted peer's header is its own claim
    assert forwarded_client("198.51.100.1", ["203.0.113.9"], trusted) == "198.51.100.1"
    assert forwarded_client("10.1.2.3", ["203.0.113.9"], trusted) == "203.0.113.9"
    # the client wrote the leftmost entries: the rightmost untrusted one is what the proxy saw
    assert forwarded_client("10.1.2.3", ["1.2.3.4, 203.0.113.9, 10.9.9.9"], trusted) == (
        "203.0.113.9"
    )
    assert forwarded_client("10.1.2.3", ["1.2.3.4", "203.0.113.9"], trusted) == "203.0.113.9"
    assert forwarded_client("10.1.2.3", ["garbage, 10.0.0.7"], trusted) == "10.0.0.7"
    assert forwarded_client("10.1.2.3", ["[2001:db8::1]:4711"], trusted) == "2001:db8::1"
    assert forwarded_client("::ffff:10.1.2.3", ["203.0.113.9:80"], trusted) == "203.0.113.9"
    assert forwarded_client("10.1.2.3", [], trusted) == "10.1.2.3"


async def test_audit_lines_name_the_client_behind_a_trusted_proxy(
    capped_server: Served, open_server: Served
) -> None:
    spoofed = {"Host": "evil.example", "X-Forwarded-For": "192.0.2.1, 203.0.113.7"}
    for server in (capped_server, open_server):  # 127.0.0.0/8 is trusted by the first only
        status, _, _ = await http_json("GET", server.url + "/api/workers", spoofed)
        assert status == 403
    await asyncio.sleep(0.3)
    behind = [ln for ln in capped_server.log_text().splitlines() if "audit.host.refused" in ln]
    assert behind and "peer=203.0.113.7" in behind[-1], behind
    direct = [ln for ln in open_server.log_text().splitlines() if "audit.host.refused" in ln]
    assert direct and "peer=127.0.0.1" in direct[-1], direct


# -- options ---------------------------------------------------------------------------------


def test_the_connection_options_reach_the_config() -> None:
    args = build_parser().parse_args(
        ["signaling", "--header-timeout", "2.5", "--keepalive-timeout", "7",
         "--max-connections-per-address", "8", "--max-connections", "100",
         "--trusted-proxy", "10.0.0.0/8", "--trusted-proxy", "fd00::/8"]
    )  # fmt: skip
    config = server_config(args, embedded_worker=False)
    assert (config.header_timeout_s, config.keepalive_timeout_s) == (2.5, 7.0)
    assert (config.max_connections_per_address, config.max_connections) == (8, 100)
    assert config.trusted_proxies == ("10.0.0.0/8", "fd00::/8")
    defaults = ServerConfig()
    assert (defaults.header_timeout_s, defaults.keepalive_timeout_s) == (10.0, 15.0)
    assert (defaults.max_connections_per_address, defaults.max_connections) == (64, 4096)
    for bad in (
        {"header_timeout_s": 0},
        {"keepalive_timeout_s": -1},
        {"max_connections": 0},
        {"max_connections_per_address": 0},
        {"max_connections": 10, "max_connections_per_address": 11},
        {"trusted_proxies": ("10.0.0.0/33",)},
        {"trusted_proxies": ("proxy.example",)},
    ):
        with pytest.raises(ConfigError):
            ServerConfig(**bad)


async def test_the_examples_are_served_at_their_folder(open_server: Served) -> None:
    """The README sends people to /client/examples/: the index, not the static route's 403;
    without the slash, a redirect to it (the page's links are relative)."""
    status, headers, body = await http_json("GET", open_server.url + "/client/examples/")
    assert status == 200 and headers["Content-Type"].startswith("text/html"), (status, headers)
    assert 'href="element.html"' in body, body[:300]
    async with aiohttp.ClientSession() as http:
        url = open_server.url + "/client/examples"
        async with http.get(url, allow_redirects=False) as response:
            assert response.status == 301
            assert response.headers["Location"] == "/client/examples/"
    status, _, _ = await http_json("GET", open_server.url + "/client/examples/element.html")
    assert status == 200
