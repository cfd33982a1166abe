"""Sharing on the page and in the SDK (docs/sharing.md), in real headless Chromium against no
server: Playwright serves the client's files and a fake signaling socket, driven by the test,
stands for `/ws`. The Share panel shows a hostile `session.shared` as text and an image (nothing
in it runs); viewer mode (`#watch=<token>`) watches with the link's token, shows who steers,
sends no steering input while someone else steers, watches again after `viewer.ended` with
`retry`, and says in a sentence why a final ending or an expired link stopped it."""

from __future__ import annotations

import json
import mimetypes
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from render_server.signaling.pages import CSP
from render_server.signaling.share_links import qr_svg

from .browser import chromium_browser
from .test_browser_client import declared_exports, declared_members

pytestmark = pytest.mark.browser

CLIENT = Path(__file__).parent.parent / "render_server" / "client"
ORIGIN = "http://render.test"
SESSION = "5e55105e55105e55105e55105e551050"
VIEWER = "3f" * 16
TOKEN = "eyJhbGciOiJIUzI1NiJ9.eyJyb2xlIjoidmlld2VyIn0.c2lnbmF0dXJl"

# `/ws`, as the test plays it: each socket opens at once, records what the page sends, and
# hands the page whatever the test says (to the newest socket)
FAKE_SOCKET = """
(() => {
  const sockets = [];
  class FakeSocket {
    constructor(url, protocols) {
      Object.assign(this, { url, protocols, readyState: 0, sent: [] });
      sockets.push(this);
      setTimeout(() => { this.readyState = 1; this.onopen?.({}); }, 0);
    }
    send(text) { this.sent.push(JSON.parse(text)); }
    close(code = 1000) {
      if (this.readyState === 3) return;
      this.readyState = 3;
      setTimeout(() => this.onclose?.({ code, reason: '' }), 0);
    }
  }
  Object.assign(FakeSocket, { CONNECTING: 0, OPEN: 1, CLOSING: 2, CLOSED: 3 });
  window.WebSocket = FakeSocket;
  window.fakeServer = {
    sockets,
    sent: () => sockets.flatMap((s) => s.sent),
    say: (message) => sockets[sockets.length - 1].onmessage(
      { data: JSON.stringify({ v: 1, ...message }) }),
    drop: (code) => {
      const socket = sockets[sockets.length - 1];
      socket.readyState = 3;
      socket.onclose?.({ code, reason: '' });
    },
  };
})();
"""

# the data channel, as the test plays it: open, recording what the page sends
STUB_CHANNEL = """() => {
  const s = window.renderStream;
  clearTimeout(s._peerTimer);  // no real peer ever connects here
  s.input = { readyState: 'open', sent: [], send(text) { this.sent.push(JSON.parse(text)); } };
}"""

BARE_PAGE = "<!doctype html><html><head><meta charset='utf-8'></head><body></body></html>"


def serve(route: Any) -> None:
    """The designer page (with the server's CSP), the client's files, and a bare page."""
    path = route.request.url.removeprefix(ORIGIN).split("?")[0].split("#")[0]
    if path == "/":
        body = (CLIENT / "index.html").read_bytes()
        headers = {"Content-Security-Policy": CSP}
        route.fulfill(status=200, headers=headers, body=body, content_type="text/html")
        return
    if path == "/bare.html":  # no CSP: what the page's own code lets through, it lets through
        route.fulfill(status=200, body=BARE_PAGE, content_type="text/html")
        return
    file = (CLIENT / path.removeprefix("/client/")).resolve()
    if path.startswith("/client/") and file.is_relative_to(CLIENT) and file.is_file():
        kind = "text/javascript" if file.suffix == ".js" else mimetypes.guess_type(file.name)[0]
        route.fulfill(status=200, body=file.read_bytes(), content_type=kind or "text/plain")
        return
    route.fulfill(status=404, body="not found")


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    with chromium_browser() as browser:
        yield browser


class Page:
    """A page of a fresh context, its errors kept (a test fails on any)."""

    def __init__(self, chromium: Any, path: str) -> None:
        self.context = chromium.new_context(viewport={"width": 960, "height": 540})
        self.context.route(f"{ORIGIN}/**", serve)
        self.context.add_init_script(FAKE_SOCKET)
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.page.on("console", lambda m: print(f"[chromium {m.type}] {m.text}"))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.goto(ORIGIN + path)

    def sent(self, kind: str) -> list[dict[str, Any]]:
        """What the page sent on its signaling sockets, of one type."""
        return [m for m in self.page.evaluate("window.fakeServer.sent()") if m["type"] == kind]

    def wait_sent(self, kind: str, count: int = 1, timeout: float = 8.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while len(found := self.sent(kind)) < count:
            assert time.monotonic() < deadline, f"the page sent no {kind} (#{count})"
            time.sleep(0.05)
        return found

    def say(self, message: dict[str, Any]) -> None:
        self.page.evaluate("(m) => window.fakeServer.say(m)", message)

    def worker_says(self, message: dict[str, Any]) -> None:
        self.page.evaluate("(m) => window.renderStream._onWorkerMessage(m)", json.dumps(message))

    def channel_sent(self) -> list[dict[str, Any]]:
        return self.page.evaluate("window.renderStream.input.sent")  # type: ignore[no-any-return]

    def state(self, wanted: str, timeout_ms: float = 8_000) -> None:
        self.page.wait_for_function(
            "(s) => window.renderStream.state === s", arg=wanted, timeout=timeout_ms
        )

    def close(self) -> None:
        self.context.close()
        assert not self.errors, self.errors


@pytest.fixture
def open_page(chromium: Any) -> Iterator[Any]:
    pages: list[Page] = []

    def opener(path: str) -> Page:
        pages.append(Page(chromium, path))
        return pages[-1]

    yield opener
    for page in pages:
        page.close()


def presence(you: str, steering: str) -> dict[str, Any]:
    return {
        "type": "presence", "you": you, "steering": steering, "maxViewers": 8,
        "peers": [
            {"id": "owner", "name": "alice", "role": "owner"},
            {"id": VIEWER, "name": "Bob <img src=x onerror=window.pwned=1>", "role": "viewer"},
        ],
    }  # fmt: skip


# -- the share panel, alone ---------------------------------------------------------------------

HOSTILE_SVG = (
    '<svg xmlns="http://www.w3.org/2000/svg" width="40" height="40" onload="window.pwned=2">'
    "<script>window.pwned=3</script>"
    '<foreignObject width="40" height="40"><img xmlns="http://www.w3.org/1999/xhtml" src="x" '
    'onerror="window.pwned=4"/></foreignObject><rect width="40" height="40"/></svg>'
)


def test_share_panel_shows_a_hostile_payload_as_text_and_an_image(open_page: Any) -> None:
    p = open_page("/bare.html")
    url = 'http://render.test/#watch=abc"><img src=x onerror="window.pwned=5">'
    real_svg = qr_svg(f"{ORIGIN}/#watch={TOKEN}")
    size = re.search(r'width="(\d+)" height="(\d+)"', real_svg)
    assert size
    outcome = p.page.evaluate(
        """async ([url, svg, realSvg]) => {
      const { renderShareLink } = await import('/client/share-panel.js');
      const panel = document.body.appendChild(document.createElement('aside'));
      const expiresAt = Math.floor(Date.now() / 1000) + 3600;
      const shared = { token: 'eyJ', url, expiresAt, qrSvg: svg, sessionId: 's' };
      renderShareLink(panel, shared);
      await new Promise((resolve) => setTimeout(resolve, 500));  // anything that would run
      const hostile = {
        pwned: window.pwned ?? null,
        link: document.getElementById('share-link').value,
        readOnly: document.getElementById('share-link').readOnly,
        tags: [...new Set([...panel.querySelectorAll('*')].map((e) => e.tagName))].sort(),
        qr: document.querySelector('#share-qr img').getAttribute('src'),
        expires: document.getElementById('share-expires').textContent,
      };
      // not an SVG at all: no image
      renderShareLink(panel, { ...shared, qrSvg: '<img src=x onerror="window.pwned=6">' });
      const notSvg = { images: panel.querySelectorAll('img').length,
                       qrHidden: document.getElementById('share-qr').hidden };
      // the server's own QR code: an image that decodes, at its size
      renderShareLink(panel, { ...shared, qrSvg: realSvg });
      const img = document.querySelector('#share-qr img');
      await img.decode();
      await new Promise((resolve) => setTimeout(resolve, 200));
      return { hostile, notSvg, real: [img.naturalWidth, img.naturalHeight],
               pwned: window.pwned ?? null };
    }""",
        [url, HOSTILE_SVG, real_svg],
    )
    hostile = outcome["hostile"]
    assert hostile["pwned"] is None and outcome["pwned"] is None, outcome
    assert hostile["link"] == url and hostile["readOnly"]
    assert hostile["tags"] == ["BUTTON", "DIV", "H2", "IMG", "INPUT", "P", "TIME"], hostile
    assert hostile["qr"].startswith("data:image/svg+xml;charset=utf-8,%3Csvg")
    assert re.search(r"\(in (59|60) min\)$", hostile["expires"]), hostile["expires"]
    assert outcome["notSvg"] == {"images": 0, "qrHidden": True}
    assert outcome["real"] == [int(size[1]), int(size[2])]


VIEWS = [("owner", "owner"), ("owner", VIEWER), (VIEWER, "owner"), (VIEWER, VIEWER)]


def test_presence_list_names_as_text_and_buttons_follow_who_steers(open_page: Any) -> None:
    p = open_page("/bare.html")
    views = p.page.evaluate(
        """async ([owner, ownerBobSteers, bobWatches, bobSteers]) => {
      const { renderPresence } = await import('/client/share-panel.js');
      const box = document.body.appendChild(document.createElement('aside'));
      const calls = [];
      const view = (presence, watching) => {
        renderPresence(box, presence, { watching, onHand: (id) => calls.push(['hand', id]),
                                        onTake: () => calls.push(['take']),
                                        onRemove: (id) => calls.push(['remove', id]) });
        const hands = [...box.querySelectorAll('button.hand-control')];
        const removes = [...box.querySelectorAll('button.remove-viewer')];
        const take = box.querySelector('#take-control');
        const seen = {
          status: box.querySelector('#presence-status').textContent,
          names: [...box.querySelectorAll('.peer-name')].map((e) => e.textContent),
          hand: hands.map((b) => b.dataset.peer),
          remove: removes.map((b) => b.dataset.peer),
          take: !take.hidden,
          hidden: box.hidden,
          images: box.querySelectorAll('img').length,
        };
        hands.forEach((b) => b.click());
        removes.forEach((b) => b.click());
        if (!take.hidden) take.click();
        return seen;
      };
      const seen = [view(owner, false), view(ownerBobSteers, false), view(bobWatches, true),
                    view(bobSteers, true)];
      const alone = { ...owner, peers: owner.peers.slice(0, 1) };
      seen.push(view(alone, false));
      await new Promise((resolve) => setTimeout(resolve, 300));
      return { seen, calls, pwned: window.pwned ?? null };
    }""",
        [presence(you, steering) for you, steering in VIEWS],
    )
    bob = "Bob <img src=x onerror=window.pwned=1>"
    owner, owner_bob_steers, bob_watches, bob_steers, alone = views["seen"]
    assert views["pwned"] is None
    assert owner == {
        "status": "You are steering · 1 watching", "names": ["alice", bob], "hand": [VIEWER],
        "remove": [VIEWER], "take": False, "hidden": False, "images": 0,
    }  # fmt: skip
    assert owner_bob_steers["status"] == f"{bob} is steering"
    assert (owner_bob_steers["hand"], owner_bob_steers["take"]) == ([], True)
    assert owner_bob_steers["remove"] == [VIEWER]  # the owner removes a viewer who steers too
    # a viewer, steering or not, removes nobody
    assert bob_watches["remove"] == bob_steers["remove"] == alone["remove"] == []
    assert bob_watches["status"] == "Watching — alice is steering"
    assert (bob_watches["hand"], bob_watches["take"]) == ([], False)
    assert bob_steers["status"] == "You are steering"
    assert (bob_steers["hand"], bob_steers["take"]) == (["owner"], False)
    assert alone["hidden"] is True  # the owner alone: no list
    assert views["calls"] == [
        ["hand", VIEWER], ["remove", VIEWER], ["remove", VIEWER], ["take"], ["hand", "owner"],
    ]  # fmt: skip


# -- the owner's page ---------------------------------------------------------------------------


def started_owner(open_page: Any) -> Page:
    """The designer page with a session on the fake server, its stream playing, its channel open."""
    p: Page = open_page("/")
    p.wait_sent("session.start")
    p.say({
        "type": "session.started", "sessionId": SESSION, "workerId": "w1", "width": 640,
        "height": 360, "fps": 30, "codec": "H264", "role": "controller",
        "resumeToken": "r" * 32, "iceServers": [],
    })  # fmt: skip
    p.wait_sent("offer")
    p.page.evaluate("window.renderStream._onStreaming()")  # as the first frame would
    p.page.evaluate(STUB_CHANNEL)
    return p


def test_share_button_asks_for_a_link_to_this_page_and_shows_it(open_page: Any) -> None:
    p = started_owner(open_page)
    page = p.page
    assert page.is_visible("#share-button") and page.is_enabled("#share-button")
    assert page.is_hidden("#viewer-name") and page.is_hidden("#share-panel")
    page.click("#share-button")
    (share,) = p.wait_sent("session.share")
    assert share == {"v": 1, "type": "session.share", "pageUrl": ORIGIN + "/"}
    link = f"{ORIGIN}/#watch={TOKEN}"
    p.say({
        "type": "session.shared", "sessionId": SESSION, "token": TOKEN,
        "expiresAt": int(time.time()) + 3 * 3600, "url": link, "qrSvg": qr_svg(link),
    })  # fmt: skip
    page.wait_for_selector("#share-qr img", timeout=5_000)
    assert page.is_visible("#share-panel")
    assert page.input_value("#share-link") == link
    assert "(in 3 hours)" in (page.text_content("#share-expires") or "")
    # under the page's CSP too, the QR code (a data: image) shows
    assert page.evaluate("document.querySelector('#share-qr img').decode().then(() => 1)") == 1
    page.click("#share-close")
    assert page.is_hidden("#share-panel")

    # the SDK: the options go out as they are; a refusal rejects, and the stream goes on
    page.evaluate("""() => { window.shareOutcome = window.renderStream
        .share({ ttlS: 120, pageUrl: 'https://app.example/viewer' })
        .then((l) => l, (e) => ({ code: e.code, message: e.message })); }""")
    assert p.wait_sent("session.share", 2)[1] == {
        "v": 1, "type": "session.share", "pageUrl": "https://app.example/viewer", "ttlS": 120,
    }  # fmt: skip
    p.say({"type": "error", "code": "forbidden", "message": "only the controller may share"})
    assert page.evaluate("window.shareOutcome") == {
        "code": "forbidden", "message": "only the controller may share",
    }  # fmt: skip
    assert page.evaluate("window.renderStream.state") == "streaming"


def test_owner_sees_who_watches_and_hands_and_takes_control(open_page: Any) -> None:
    p = started_owner(open_page)
    page = p.page
    p.worker_says(presence("owner", "owner"))
    page.wait_for_selector("#presence li[data-peer] >> nth=1", timeout=5_000)
    assert page.text_content("#presence-status") == "You are steering · 1 watching"
    page.click(f"#presence button.hand-control[data-peer='{VIEWER}']")
    hand = p.channel_sent()[-1]
    assert (hand["type"], hand["name"], hand["args"]) == ("command", "control.hand", {"to": VIEWER})
    p.worker_says({"type": "result", "id": hand["id"], "value": None})

    # Bob steers: the owner's steering input stays home (the worker would refuse it)
    p.worker_says(presence("owner", VIEWER))
    assert page.evaluate("window.renderStream.steering") is False
    before = len(p.channel_sent())
    sent = page.evaluate("""() => [
      window.renderStream.sendInput(
        {type: 'pointer', action: 'move', x: .5, y: .5, dx: 1, dy: 0, buttons: 1}),
      window.renderStream.sendInput({type: 'key', action: 'down', code: 'KeyW'}),
      window.renderStream.requestKeyframe()]""")
    assert sent == [False, False, True]
    assert [m["type"] for m in p.channel_sent()[before:]] == ["keyframe"]
    assert page.is_visible("#take-control")
    page.click("#take-control")
    take = p.channel_sent()[-1]
    assert (take["name"], take["args"]) == ("control.take", {})

    # the owner removes Bob; a refusal is said on the status line, the stream goes on
    page.click(f"#presence button.remove-viewer[data-peer='{VIEWER}']")
    remove = p.channel_sent()[-1]
    assert (remove["name"], remove["args"]) == ("control.remove", {"peer": VIEWER})
    p.worker_says({"type": "error", "id": remove["id"], "code": "bad_command",
                   "message": "no viewer watches"})  # fmt: skip
    page.wait_for_function(
        "document.getElementById('status').textContent.startsWith('Viewer not removed')",
        timeout=5_000,
    )
    assert page.evaluate("window.renderStream.state") == "streaming"


# -- viewer mode --------------------------------------------------------------------------------


def test_viewer_mode_watches_with_the_link_and_steers_only_when_handed(open_page: Any) -> None:
    p = open_page(f"/?name=Bob#watch={TOKEN}")
    page = p.page
    (watch,) = p.wait_sent("session.watch")
    assert watch == {"v": 1, "type": "session.watch", "token": TOKEN, "name": "Bob"}
    protocols = page.evaluate("window.fakeServer.sockets[0].protocols")
    assert protocols == ["render-server.v1", f"bearer.{TOKEN}"]
    assert p.sent("session.start") == []
    assert page.evaluate("document.body.classList.contains('viewer')")
    assert page.query_selector("#share-button") is None  # no Share button for a viewer
    assert page.is_hidden("#quality") and page.is_hidden("#open-model")
    assert page.input_value("#viewer-name") == "Bob"
    assert page.evaluate("localStorage.getItem('render-server.viewer-name')") == "Bob"
    assert page.text_content("#presence-status") == "Watching a shared session…"

    p.say({"type": "session.watching", "sessionId": SESSION, "viewerId": VIEWER, "iceServers": []})
    p.wait_sent("offer")
    session = page.evaluate("window.renderStream.session")
    assert (session["role"], session["viewerId"]) == ("viewer", VIEWER)
    page.evaluate("window.renderStream._onStreaming()")
    page.evaluate(STUB_CHANNEL)

    p.worker_says(presence(VIEWER, "owner"))
    assert page.text_content("#presence-status") == "Watching — alice is steering"
    assert page.evaluate("window.renderStream.steering") is False
    outcome = page.evaluate("""async () => {
      const s = window.renderStream;
      const pointer = s.sendInput({type: 'wheel', dy: 3});
      const quality = await s.setQuality({width: 640}).then(() => 'applied', (e) => e.code);
      return { pointer, quality, sent: s.input.sent.filter((m) => m.type !== 'ping') };
    }""")
    assert outcome == {"pointer": False, "quality": "forbidden", "sent": []}

    p.worker_says(presence(VIEWER, VIEWER))  # handed control
    assert page.text_content("#presence-status") == "You are steering"
    assert page.evaluate("window.renderStream.sendInput({type: 'wheel', dy: 3})") is True
    assert p.channel_sent()[-1]["type"] == "wheel"
    assert page.is_visible("#presence button.hand-control[data-peer='owner']")

    # the session moves: the viewer watches again (a fresh session.watch), then offers again
    p.say({"type": "viewer.ended", "code": "moved", "message": "moving", "retry": True})
    p.state("reconnecting")
    p.wait_sent("session.watch", 2)
    p.say({"type": "session.watching", "sessionId": SESSION, "viewerId": "4a" * 16})
    p.wait_sent("offer", 2)
    assert page.evaluate("window.renderStream.viewerId") == "4a" * 16

    # a final ending: the stream fails, and the page says why in a sentence
    final = {"type": "viewer.ended", "code": "too_many_viewers", "message": "8", "retry": False}
    p.say(final)
    p.state("error")
    assert page.text_content("#status") == (
        "Too many people are watching this session: try again later."
    )
    assert "error" in (page.get_attribute("#status", "class") or "")
    assert page.evaluate("window.renderStream.reason").startswith("too_many_viewers")


def test_a_removed_viewer_is_told_so_and_does_not_watch_again(open_page: Any) -> None:
    p = open_page(f"/?name=Bob#watch={TOKEN}")
    page = p.page
    p.wait_sent("session.watch")
    p.say({"type": "session.watching", "sessionId": SESSION, "viewerId": VIEWER, "iceServers": []})
    p.wait_sent("offer")
    page.evaluate("window.renderStream._onStreaming()")
    p.say({"type": "viewer.ended", "code": "removed", "message": "alice removed you from this "
           "session", "retry": False})  # fmt: skip
    p.state("error")
    assert page.text_content("#status") == "The owner removed you from this session."
    page.wait_for_timeout(1500)  # longer than the first reconnect's backoff
    assert len(p.sent("session.watch")) == 1


def test_a_viewer_watches_again_after_its_socket_or_its_peer_drops(open_page: Any) -> None:
    p = open_page(f"/#watch={TOKEN}")
    page = p.page
    p.wait_sent("session.watch")
    p.say({"type": "session.watching", "sessionId": SESSION, "viewerId": VIEWER})
    p.wait_sent("offer")
    page.evaluate("window.renderStream._onStreaming()")

    page.evaluate("window.fakeServer.drop(1006)")  # the socket drops: no resume, a new watch
    p.state("reconnecting")
    p.wait_sent("session.watch", 2)
    assert page.evaluate("window.fakeServer.sockets.length") == 2
    assert page.evaluate("window.fakeServer.sockets[1].protocols[1]") == f"bearer.{TOKEN}"
    assert p.sent("session.resume") == []
    p.say({"type": "session.watching", "sessionId": SESSION, "viewerId": VIEWER})
    p.wait_sent("offer", 2)
    page.evaluate("window.renderStream._onStreaming()")

    page.evaluate("window.renderStream._peerLost('peer connection failed')")  # on that socket
    p.state("reconnecting")
    p.wait_sent("session.watch", 3)
    assert page.evaluate("window.fakeServer.sockets.length") == 2
    # by now the link has expired: watching again is refused for good
    p.say({"type": "error", "code": "unauthorized", "message": "the share link has expired"})
    p.state("error")
    assert page.text_content("#status") == (
        "This share link has expired or is not valid: ask for a new one."
    )


def test_an_expired_link_and_an_ended_session_are_said_in_a_sentence(open_page: Any) -> None:
    expired = open_page("/#watch=expired.token.here")
    expired.wait_sent("session.watch")
    expired.say({"type": "error", "code": "unauthorized", "message": "the share link has expired"})
    expired.state("error")
    assert expired.page.text_content("#status") == (
        "This share link has expired or is not valid: ask for a new one."
    )
    assert expired.page.evaluate("localStorage.getItem('render-server.viewer-name')") is None
    assert expired.page.input_value("#viewer-name") == "viewer"

    ended = open_page(f"/#watch={TOKEN}")
    ended.wait_sent("session.watch")
    ended.say({"type": "session.watching", "sessionId": SESSION, "viewerId": VIEWER})
    ended.wait_sent("offer")
    ended.say({"type": "viewer.ended", "code": "session_ended", "message": "bye", "retry": False})
    ended.state("ended")
    assert ended.page.text_content("#status") == "The shared session has ended."
    assert ended.page.evaluate("window.renderStream.reason") == "session_ended"


def test_the_element_watches_with_a_watch_token(open_page: Any) -> None:
    p = open_page("/bare.html")
    p.page.evaluate("""async (token) => {
      await import('/client/render-stream-element.js');
      const element = document.createElement('render-stream');
      element.setAttribute('watch-token', token);
      element.setAttribute('viewer-name', 'Eve');
      element.addEventListener('presence', ({ detail }) => { window.seenPresence = detail; });
      document.body.append(element);
      window.renderStream = element.stream;
    }""", TOKEN)  # fmt: skip
    (watch,) = p.wait_sent("session.watch")
    assert (watch["token"], watch["name"]) == (TOKEN, "Eve")
    assert p.page.evaluate("window.fakeServer.sockets[0].protocols")[1] == f"bearer.{TOKEN}"
    p.say({"type": "session.watching", "sessionId": SESSION, "viewerId": VIEWER})
    p.wait_sent("offer")
    p.worker_says(presence(VIEWER, "owner"))
    assert p.page.evaluate("window.seenPresence.steering") == "owner"
    p.say({"type": "viewer.ended", "code": "session_ended", "message": "bye"})
    p.page.wait_for_selector("render-stream[data-state='ended']", state="attached", timeout=5_000)


# -- the SDK's types ----------------------------------------------------------------------------


def test_sharing_is_typed_and_the_types_match_the_modules(open_page: Any) -> None:
    p = open_page("/bare.html")
    for module in ("render-stream", "render-stream-element"):
        exported = set(p.page.evaluate(f"import('/client/{module}.js').then(m => Object.keys(m))"))
        assert exported == declared_exports(CLIENT / f"{module}.d.ts"), module
    methods = set(
        p.page.evaluate("""import('/client/render-stream.js').then(({RenderStream: R}) => [
        ...Object.getOwnPropertyNames(R.prototype),
        ...Object.getOwnPropertyNames(R).filter(n => typeof R[n] === 'function'),
      ].filter(n => !n.startsWith('_') && n !== 'constructor'))""")
    )
    declared = declared_members(CLIENT / "render-stream.d.ts", "RenderStream")
    assert methods == declared - {"addEventListener"}
    assert {"share", "handControl", "takeControl", "watch"} <= methods
    dts = (CLIENT / "render-stream.d.ts").read_text()
    for needle in (
        "watch?: WatchOptions | null;", "presence: CustomEvent<Presence>;",
        "readonly presence: Presence | null;", "readonly steering: boolean;",
        "readonly viewerId: string | null;", "readonly watchToken: string | null;",
    ):  # fmt: skip
        assert needle in dts, needle
