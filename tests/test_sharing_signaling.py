"""Share links and viewers at signaling, against real `render-server signaling` processes (auth
on) and a worker that speaks the protocol without rendering (`fake_worker.py`): who may share,
what a link's token may and may not open, the viewer's messages relayed to the worker that holds
the session and back, across two replicas on a real Redis."""

from __future__ import annotations

import asyncio
import time
import urllib.parse
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import jwt
import pytest

from render_server.protocol.viewers import (
    ViewerEnded,
    ViewerIce,
    ViewerLeave,
    ViewerOffer,
    ViewerRequest,
    ViewersEnd,
)
from tests.fake_worker import PLACEHOLDER_SDP, FakeWorker

from .processes import SECRET, Process, SignalClient, start_signaling, stopping, token
from .redis_server import redis_server
from .support import eventually_async

pytestmark = pytest.mark.asyncio

PAGE = "http://127.0.0.1:8080/"
OFFER = "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\n"
CANDIDATE = "candidate:1 1 udp 2122260223 127.0.0.1 50000 typ host"


@pytest.fixture
def replica(tmp_path: Path) -> Iterator[Process]:
    proc = start_signaling("replica", None, tmp_path)
    with stopping(proc):
        yield proc


@pytest.fixture
async def worker(replica: Process) -> AsyncIterator[FakeWorker]:
    made = await start_fake_worker(replica)
    yield made
    await made.stop()


async def start_fake_worker(replica: Process, worker_id: str = "fake-1") -> FakeWorker:
    url = f"ws://127.0.0.1:{replica.port}/worker"
    made = FakeWorker(url, worker_id, 2, token=token("worker", worker_id))
    await made.start()
    return made


async def connect(replica: Process, bearer: str | None) -> SignalClient:
    client = SignalClient(replica.ws, bearer)
    await client.connect()
    return client


async def owner_session(replica: Process, subject: str = "alice") -> tuple[SignalClient, str]:
    owner = await connect(replica, token("controller", subject))
    await owner.send(type="session.start")
    started = await owner.next("session.started")
    await owner.send(type="offer", sdp=OFFER)  # within the offer deadline: the slot is kept
    await owner.next("answer")
    return owner, started["sessionId"]


async def share(owner: SignalClient, **fields: Any) -> dict[str, Any]:
    await owner.send(type="session.share", **fields)
    return await owner.next("session.shared", "error")


async def next_request(worker: FakeWorker) -> ViewerRequest:
    return await asyncio.wait_for(worker.viewer_requests.get(), 10)


async def test_the_owner_shares_and_a_viewer_watches_through_the_worker(
    replica: Process, worker: FakeWorker
) -> None:
    owner, sid = await owner_session(replica)
    assert worker.names[sid] == "alice"  # what the viewers will see as the owner's name
    before = time.time()
    shared = await share(owner, pageUrl=PAGE, ttlS=600)
    assert shared["type"] == "session.shared" and shared["sessionId"] == sid
    link = shared["token"]
    assert shared["url"] == f"{PAGE}#watch={link}"  # the token in the fragment, never sent
    assert shared["qrSvg"].startswith("<svg") and "</svg>" in shared["qrSvg"]
    assert before + 600 - 5 <= shared["expiresAt"] <= time.time() + 600 + 5
    claims = jwt.decode(link, SECRET, algorithms=["HS256"], audience="render-server")
    assert (claims["role"], claims["sid"]) == ("viewer", sid)

    viewer = await connect(replica, link)  # the link's token opens the socket, as a viewer's
    await viewer.send(type="session.watch", token=link, name="  Bob   B.  ")
    watching = await viewer.next("session.watching")
    assert watching["sessionId"] == sid and len(watching["viewerId"]) == 32
    vid = watching["viewerId"]

    await viewer.send(type="offer", sdp=OFFER)
    offer = await next_request(worker)
    assert isinstance(offer, ViewerOffer)
    assert (offer.session_id, offer.viewer_id, offer.name) == (sid, vid, "Bob B.")
    assert (await viewer.next("answer"))["sdp"] == PLACEHOLDER_SDP
    await viewer.send(type="ice", candidate=CANDIDATE, sdpMid="0", sdpMLineIndex=0)
    ice = await next_request(worker)
    assert isinstance(ice, ViewerIce) and ice.viewer_id == vid and ice.candidate == CANDIDATE

    # the worker ends the viewer's stream: the page hears why, and whether to try again
    await worker.send_message(ViewerEnded(sid, vid, "too_many_viewers", "8 watch already"))
    ended = await viewer.next("viewer.ended")
    assert (ended["code"], ended["retry"]) == ("too_many_viewers", False)

    # watching again on the same socket, then closing it: the worker lets its peer go
    await viewer.send(type="session.watch", token=link)
    second = (await viewer.next("session.watching"))["viewerId"]
    await viewer.send(type="offer", sdp=OFFER)
    assert isinstance(await next_request(worker), ViewerOffer)
    await viewer.close()
    left = await next_request(worker)
    assert isinstance(left, ViewerLeave) and (left.viewer_id, left.reason) == (second, "left")
    # the owner's session is untouched by all of it
    await owner.send(type="offer", sdp=OFFER)
    assert (await owner.next("answer", "error"))["type"] == "answer"
    assert sid in worker.sessions
    await owner.close()


async def test_a_link_only_watches_and_only_its_session(
    replica: Process, worker: FakeWorker
) -> None:
    owner, sid = await owner_session(replica)
    link = (await share(owner))["token"]
    other_owner, _ = await owner_session(replica, "carol")
    other_link = (await share(other_owner))["token"]

    viewer = await connect(replica, link)
    for refused in ({"type": "session.start"}, {"type": "session.share"}):
        await viewer.send(**refused)
        assert (await viewer.next("error"))["code"] == "forbidden"
    await viewer.send(type="session.resume", sessionId=sid, resumeToken="x" * 32)
    assert (await viewer.next("error"))["code"] == "forbidden"
    # a socket opened with one session's link cannot watch another's
    await viewer.send(type="session.watch", token=other_link)
    assert (await viewer.next("error"))["code"] == "forbidden"
    # nor does the link open the REST API (it would start sessions or list the fleet)
    async with aiohttp.ClientSession() as http:
        for method, path in (("GET", "/api/workers"), ("POST", "/api/sessions")):
            headers = {"Authorization": f"Bearer {link}"}
            async with http.request(method, replica.url + path, headers=headers) as response:
                assert response.status == 403, path
    # a viewer offers only after watching, and a watching socket cannot start a session
    await viewer.send(type="offer", sdp=OFFER)
    assert (await viewer.next("error"))["code"] == "bad_order"
    await viewer.send(type="session.watch", token=link)
    await viewer.next("session.watching")
    await viewer.send(type="session.end")
    await viewer.send(type="session.start")  # no longer watching: but still a link's token
    assert (await viewer.next("error"))["code"] == "forbidden"
    await viewer.close()
    assert worker.viewer_requests.empty()  # it never offered: nothing reached the worker

    # a controller's own socket may watch with a link, but not while it holds a session
    await owner.send(type="session.watch", token=other_link)
    assert (await owner.next("error"))["code"] == "bad_order"
    for client in (owner, other_owner):
        await client.close()


async def test_links_that_do_not_open(replica: Process, worker: FakeWorker) -> None:
    owner, sid = await owner_session(replica)
    anonymous = await connect(replica, token("controller", "mallory"))

    async def refused(link: str) -> dict[str, Any]:
        await anonymous.send(type="session.watch", token=link)
        return await anonymous.next("error", "session.watching")

    now = int(time.time())
    base = {"sub": "v", "role": "viewer", "aud": "render-server", "sid": sid, "iat": now}
    expired = jwt.encode({**base, "exp": now - 60}, SECRET, headers={"kid": "default"})
    forged = jwt.encode({**base, "exp": now + 60}, "another-secret-long-enough-for-hs256!")
    controller = jwt.encode(
        {**base, "role": "controller", "exp": now + 60}, SECRET, headers={"kid": "default"}
    )
    unbound = token("viewer", "someone")  # a viewer's token, but no session in it
    for link, why in (
        (expired, "expired"),
        (forged, "not valid"),
        (controller, "not a share link"),
        (unbound, "not valid"),
        ("x" * 5000, "longer than"),
    ):
        reply = await refused(link)
        assert reply["type"] == "error" and why in reply["message"], (why, reply)
        assert reply["code"] in ("unauthorized", "too_large")
    # malformed watch and share messages
    for bad in (
        {"type": "session.watch"},
        {"type": "session.watch", "token": "t", "name": ""},
        {"type": "session.watch", "token": "t", "name": "x" * 41},
        {"type": "session.watch", "token": "t", "name": "a\u202eb"},  # a disguising control
    ):
        await anonymous.send(**bad)
        assert (await anonymous.next("error"))["code"] == "bad_message", bad
    for bad_share in ({"pageUrl": "javascript:alert(1)"}, {"pageUrl": PAGE + "#x"},
                      {"ttlS": 5}, {"ttlS": 10**9}, {"ttlS": "60"}):  # fmt: skip
        await owner.send(type="session.share", **bad_share)
        assert (await owner.next("error"))["code"] == "bad_message", bad_share
    # sharing needs a session, held as its controller
    await anonymous.send(type="session.share")
    assert (await anonymous.next("error"))["code"] == "bad_order"
    viewer_owned = await connect(replica, token("viewer", "vic"))
    await viewer_owned.send(type="session.start")
    await viewer_owned.next("session.started", "queue")
    await viewer_owned.send(type="session.share")
    assert (await viewer_owned.next("error"))["code"] == "forbidden"
    # a link to a session that ended
    link = (await share(owner))["token"]
    await owner.send(type="session.end")
    await owner.next("session.ended")
    assert (await refused(link))["code"] == "unknown_session"
    for client in (owner, anonymous, viewer_owned):
        await client.close()


async def test_a_worker_speaks_only_to_the_viewers_of_its_own_sessions(
    replica: Process, worker: FakeWorker
) -> None:
    owner, sid = await owner_session(replica)
    link = (await share(owner))["token"]
    viewer = await connect(replica, link)
    await viewer.send(type="session.watch", token=link)
    vid = (await viewer.next("session.watching"))["viewerId"]
    intruder = await start_fake_worker(replica, "fake-2")
    try:
        await intruder.send_message(ViewerEnded(sid, vid, "session_ended", "forged"))
        assert (await intruder.next_error())["code"] == "forbidden"
        with pytest.raises(asyncio.TimeoutError):
            await viewer.next("viewer.ended", timeout=1.0)
    finally:
        await intruder.stop()
    for client in (owner, viewer):
        await client.close()


async def test_a_viewer_on_another_replica_reaches_the_session_s_worker(
    tmp_path: Path,
) -> None:
    with redis_server() as url:
        r1 = start_signaling("replica-1", url, tmp_path)
        r2 = start_signaling("replica-2", url, tmp_path)
        with stopping(r1), stopping(r2):
            worker = await start_fake_worker(r1)
            try:
                owner, sid = await owner_session(r1)
                shared = await share(owner, pageUrl=PAGE)
                fragment = urllib.parse.urlsplit(shared["url"]).fragment
                link = fragment.removeprefix("watch=")
                viewer = await connect(r2, link)  # the link minted on replica-1, read here
                await viewer.send(type="session.watch", token=link, name="Dana")
                vid = (await viewer.next("session.watching"))["viewerId"]
                await viewer.send(type="offer", sdp=OFFER)
                offer = await next_request(worker)
                assert isinstance(offer, ViewerOffer) and offer.viewer_id == vid
                assert (await viewer.next("answer"))["sdp"] == PLACEHOLDER_SDP
                # the worker's word reaches the viewer's replica; retry where it may help
                await worker.send_message(ViewerEnded(sid, vid, "moved", "moving"))
                ended = await viewer.next("viewer.ended")
                assert (ended["code"], ended["retry"]) == ("moved", True)

                async def viewers_gauge() -> bool:
                    async with aiohttp.ClientSession() as http:
                        async with http.get(r2.url + "/metrics") as response:
                            text = await response.text()
                    return "signaling_viewers 0.0" in text and "signaling_watch_total" in text

                await eventually_async(viewers_gauge, timeout=10, what="signaling_viewers")
                for client in (owner, viewer):
                    await client.close()
            finally:
                await worker.stop()


async def test_stopping_sharing_withdraws_every_link_and_ends_the_viewers(
    replica: Process, worker: FakeWorker
) -> None:
    owner, sid = await owner_session(replica)
    link = (await share(owner, ttlS=60))["token"]
    viewer = await connect(replica, link)
    await viewer.send(type="session.watch", token=link)
    watching = await viewer.next("session.watching")
    # what to watch again with: a token of its own that outlives the link's minute
    rewatch = watching["token"]
    claims = jwt.decode(rewatch, SECRET, algorithms=["HS256"], audience="render-server")
    assert claims["sid"] == sid and claims["exp"] >= time.time() + 800
    await viewer.send(type="session.watch", token=rewatch)
    await viewer.next("session.watching")

    await viewer.send(type="session.unshare")  # not the viewer's to do
    assert (await viewer.next("error"))["code"] == "forbidden"
    await owner.send(type="session.unshare")
    assert (await owner.next("session.unshared"))["sessionId"] == sid
    ended = await next_request(worker)
    assert isinstance(ended, ViewersEnd) and (ended.session_id, ended.code) == (sid, "revoked")
    for old in (link, rewatch):  # neither the link nor a viewer's own token opens it now
        await viewer.send(type="session.watch", token=old)
        refused = await viewer.next("error")
        assert refused["code"] == "unauthorized" and "stopped sharing" in refused["message"]
    # sharing again makes links that work
    fresh = (await share(owner))["token"]
    await viewer.send(type="session.watch", token=fresh)
    assert (await viewer.next("session.watching"))["sessionId"] == sid
    for client in (owner, viewer):
        await client.close()
