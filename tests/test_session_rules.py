"""Session rules under attack, against real `render-server signaling` processes (auth on): the
role is the token's on every resume (and the worker enforces it), only the owner's controller
or an admin ends a session, caps on the sessions and queue places of a subject and of an
address (fleet-wide on Redis), an offer deadline, and requirements no worker can ever meet."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import jwt
import pytest

from render_server.tools.viewer import Viewer
from tests.fake_worker import FakeWorker

from .processes import (
    SECRET,
    Process,
    SignalClient,
    environment,
    run,
    start_signaling,
    start_worker,
    stopping,
    token,
    wait_for_workers,
)
from .redis_server import redis_server
from .support import ServerFactory, eventually_async, ws_url

STEER = {"type": "pointer", "action": "move", "dx": 0.05, "dy": 0.0, "buttons": 1}


@pytest.fixture
def replica(tmp_path: Path) -> Iterator[Process]:
    """One signaling replica with the default rules."""
    proc = start_signaling("replica", None, tmp_path)
    with stopping(proc):
        yield proc


async def fake_worker(replica: Process, slots: int = 1, **kwargs: Any) -> FakeWorker:
    url = f"ws://127.0.0.1:{replica.port}/worker"
    worker = FakeWorker(url, "fake-1", slots, token=token("worker", "fake-1"), **kwargs)
    await worker.start()
    return worker


@pytest.fixture
async def worker(replica: Process) -> AsyncIterator[FakeWorker]:
    made = await fake_worker(replica)
    yield made
    await made.stop()


async def client(replica: Process, subject: str, role: str = "controller") -> SignalClient:
    made = SignalClient(replica.ws, token(role, subject))
    await made.connect()
    return made


async def start(browser: SignalClient, **requirements: Any) -> dict[str, Any]:
    """`session.start`; the first answer (`session.started`, `queue` or `error`)."""
    if requirements:
        await browser.send(type="session.start", requirements=requirements)
    else:
        await browser.send(type="session.start")
    return await browser.next("session.started", "queue", "error")


async def rest(
    method: str, replica: Process, path: str, bearer: str, body: Any = None
) -> tuple[int, dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as http,
        http.request(
            method, replica.url + path, json=body, headers={"Authorization": f"Bearer {bearer}"}
        ) as response,
    ):
        return response.status, await response.json()


def audited(replica: Process, event: str) -> bool:
    return f" {event} " in replica.log.read_text()


# -- roles come from the token presented -------------------------------------------------------


async def test_a_viewer_token_resumes_a_session_as_a_viewer_and_the_worker_refuses_its_input(
    replica: Process, tmp_path: Path
) -> None:
    real = start_worker("worker-1", replica, tmp_path, 1)
    with stopping(real):
        wait_for_workers(replica, 1, [real])
        alice = Viewer(replica.ws, token=token("controller", "alice"))
        started = await alice.start(timeout=30)
        await alice.next_frame(timeout=30)
        sid = started["sessionId"]
        resume = (sid, started["resumeToken"])
        await alice.drop()  # the page reloads ...

        # ... with a viewer token of the same subject: it watches, and only watches
        watcher = Viewer(replica.ws, token=token("viewer", "alice"), resume=resume)
        resumed = await watcher.start(timeout=30)
        assert (resumed["sessionId"], resumed["role"]) == (sid, "viewer")
        await watcher.next_frame(timeout=30)
        await watcher.send_input(STEER)
        refused = await watcher.wait_message("error", code="forbidden", timeout=15)
        assert "viewer" in refused["message"]  # said by the worker, on the data channel
        await watcher.send_input({"type": "command", "id": 1, "name": "setCamera",
                                  "args": {"yaw": 1.0}})  # fmt: skip
        assert (await watcher.wait_message("error", id=1))["code"] == "forbidden"
        status, described = await rest("GET", replica, f"/api/sessions/{sid}", watcher.token)
        assert (status, described["role"]) == (200, "viewer")  # the record says so too
        await watcher.drop()

        # the controller token of the same subject takes it back, and steers again
        boss = Viewer(replica.ws, token=token("controller", "alice"), resume=resume)
        assert (await boss.start(timeout=30))["role"] == "controller"
        await boss.next_frame(timeout=30)
        await boss.send_input({"type": "command", "id": 2, "name": "setCamera",
                               "args": {"yaw": 1.0}})  # fmt: skip
        camera = (await boss.wait_message("result", id=2, timeout=15))["value"]
        assert abs(camera["yaw"] - 1.0) < 1e-6
        assert not boss.errors
        await boss.close()
    assert audited(replica, "audit.session.resume")


async def test_only_the_owners_controller_or_an_admin_ends_a_session(
    replica: Process, worker: FakeWorker
) -> None:
    alice = await client(replica, "alice")
    bob = await client(replica, "bob")
    try:
        sid = (await start(alice))["sessionId"]
        path = f"/api/sessions/{sid}"
        # alice's viewer token reads her session but cannot end it
        status, body = await rest("DELETE", replica, path, token("viewer", "alice"))
        assert (status, body.get("code")) == (403, "forbidden"), body
        assert (await rest("GET", replica, path, token("viewer", "alice")))[0] == 200
        assert audited(replica, "audit.api.refused")
        # her controller token can
        assert (await rest("DELETE", replica, path, token("controller", "alice")))[0] == 202
        assert (await alice.next("session.ended"))["reason"] == "ended_by_api"

        # an admin reads and ends anyone's session, and lists the workers
        admin = token("admin", "ops")
        bob_sid = (await start(bob))["sessionId"]
        status, described = await rest("GET", replica, f"/api/sessions/{bob_sid}", admin)
        assert (status, described["owner"]) == (200, "bob")
        assert (await rest("DELETE", replica, f"/api/sessions/{bob_sid}", admin))[0] == 202
        assert (await bob.next("session.ended"))["reason"] == "ended_by_api"
        status, listed = await rest("GET", replica, "/api/workers", admin)
        assert (status, [w["id"] for w in listed["workers"]]) == (200, ["fake-1"])
        # but opens neither socket, and starts no session
        async with aiohttp.ClientSession() as http:
            for path in ("/ws", "/worker"):
                with pytest.raises(aiohttp.WSServerHandshakeError) as info:
                    await http.ws_connect(
                        f"ws://127.0.0.1:{replica.port}{path}",
                        headers={"Authorization": f"Bearer {admin}"},
                    )
                assert info.value.status == 403, path
        status, body = await rest("POST", replica, "/api/sessions", admin, {})
        assert (status, body.get("code")) == (403, "forbidden")
    finally:
        await alice.close()
        await bob.close()


async def test_a_socket_whose_session_was_resumed_elsewhere_speaks_for_it_no_more(
    tmp_path: Path,
) -> None:
    proc = start_signaling("replica", None, tmp_path, "--resume-grace", "1")
    with stopping(proc):
        fake = await fake_worker(proc)
        owner = await client(proc, "alice")
        viewer = await client(proc, "alice", "viewer")
        boss = await client(proc, "alice")
        control = await client(proc, "carol")  # a session whose browser does leave
        try:
            started = await start(owner)
            attach = {"sessionId": started["sessionId"], "resumeToken": started["resumeToken"]}
            await viewer.send(type="session.resume", **attach)  # the owner's tab stays open
            assert (await viewer.next("session.started"))["role"] == "viewer"
            await boss.send(type="session.resume", **attach)
            assert (await boss.next("session.started"))["role"] == "controller"
            # the viewer's socket, no longer the session's, cannot offer into it (its data
            # channel would then carry a controller's input)
            await viewer.send(type="offer", sdp="v=0\r\n")
            refused = await viewer.next("error", "answer")
            assert (refused["type"], refused.get("code")) == ("error", "bad_order"), refused
            left = (await start(control))["sessionId"]  # queued: the one slot is taken
            # the sockets it was taken from close: the session, held by another, goes on
            await owner.close()
            await viewer.close()
            closed = time.monotonic()
            await control.close()  # after them: its grace period ends after theirs would
            bearer = token("controller", "carol")

            async def control_ended() -> bool:
                return (await rest("GET", proc, f"/api/sessions/{left}", bearer))[0] == 404

            await eventually_async(control_ended, 30, what="the grace period's end")
            assert time.monotonic() - closed > 0.9  # it ended for leaving, a grace (1 s) later
            await boss.send(type="offer", sdp="v=0\r\n")
            assert (await boss.next("answer", "session.ended"))["type"] == "answer"
            path = f"/api/sessions/{started['sessionId']}"
            assert (await rest("GET", proc, path, token("viewer", "alice")))[0] == 200
        finally:
            for browser in (owner, viewer, boss, control):
                await browser.close()
            await fake.stop()


def test_the_token_command_mints_an_admin_token() -> None:
    done = run("token", "--role", "admin", "--subject", "ops", env=environment())
    assert done.returncode == 0, done.stderr
    claims = jwt.decode(done.stdout.strip(), SECRET, algorithms=["HS256"], audience="render-server")
    assert (claims["role"], claims["sub"]) == ("admin", "ops")


# -- caps on sessions and queue places ---------------------------------------------------------


async def test_one_token_holds_at_most_24_sessions_and_queue_places(
    replica: Process, worker: FakeWorker
) -> None:
    hoarder = token("controller", "hoarder")
    browsers = [SignalClient(replica.ws, hoarder) for _ in range(25)]
    other = SignalClient(replica.ws, token("controller", "other"))
    await asyncio.gather(*(b.connect() for b in [*browsers, other]))
    try:
        answers = [(await start(b))["type"] for b in browsers[:24]]
        assert answers == ["session.started"] + ["queue"] * 23  # one slot, 23 queue places
        refused = await start(browsers[24])
        assert (refused["type"], refused.get("code")) == ("error", "too_many_sessions"), refused
        status, body = await rest("POST", replica, "/api/sessions", hoarder, {})
        assert (status, body.get("code")) == (429, "too_many_sessions")
        assert (await start(other))["type"] == "queue"  # another subject at this address
        assert audited(replica, "audit.session.too_many")
        # one session ends: its place is free, and the refused socket (still open) takes it
        await browsers[0].send(type="session.end")
        await browsers[0].next("session.ended")
        assert (await start(browsers[24]))["type"] == "queue"
    finally:
        await asyncio.gather(*(b.close() for b in [*browsers, other]))


async def test_the_caps_hold_fleet_wide_across_two_replicas(tmp_path: Path) -> None:
    with redis_server() as url:
        caps = ("--max-sessions-per-subject", "3", "--max-sessions-per-address", "5")
        r1 = start_signaling("replica-1", url, tmp_path, *caps)
        r2 = start_signaling("replica-2", url, tmp_path, *caps)
        with stopping(r1, r2):
            fake = await fake_worker(r1)
            made: list[SignalClient] = []

            async def browser(replica: Process, subject: str) -> SignalClient:
                made.append(await client(replica, subject))
                return made[-1]

            try:
                alices = [await browser(r, "alice") for r in (r1, r2, r1, r2)]
                assert [(await start(a))["type"] for a in alices[:3]] == [
                    "session.started", "queue", "queue"
                ]  # fmt: skip
                over = await start(alices[3])  # on the other replica: the same count
                assert over.get("code") == "too_many_sessions", over
                assert "subject" in over["message"]
                status, _ = await rest("POST", r2, "/api/sessions", token("controller", "alice"))
                assert status == 429
                # the address: two more subjects fill it, a third is refused on either replica
                assert (await start(await browser(r2, "bob")))["type"] == "queue"
                assert (await start(await browser(r1, "carol")))["type"] == "queue"
                dave = await browser(r2, "dave")
                over = await start(dave)
                assert over.get("code") == "too_many_sessions", over
                assert "address" in over["message"]
                # a session ending on one replica frees its place for the other
                await alices[0].send(type="session.end")
                await alices[0].next("session.ended")
                assert (await start(dave))["type"] in ("session.started", "queue")
                assert audited(r2, "audit.session.too_many")
            finally:
                for browser_ in made:
                    await browser_.close()
                await fake.stop()


async def test_with_authentication_off_only_the_address_is_capped(
    start_server: ServerFactory,
) -> None:
    server = await start_server(max_sessions_per_subject=1, max_sessions_per_address=3)
    browsers = [SignalClient(ws_url(server), None) for _ in range(4)]
    await asyncio.gather(*(b.connect() for b in browsers))
    try:
        answers = [(await start(b))["type"] for b in browsers]
        assert answers == ["session.started", "session.started", "queue", "error"]
        assert browsers[3].seen[-1]["code"] == "too_many_sessions"
    finally:
        await asyncio.gather(*(b.close() for b in browsers))


# -- the offer deadline ------------------------------------------------------------------------


async def test_a_session_that_never_offers_frees_its_slot_after_the_deadline(
    replica: Process, worker: FakeWorker
) -> None:
    silent = await client(replica, "silent")
    waiting = await client(replica, "waiting")
    try:
        opened_at = time.monotonic()
        sid = (await start(silent))["sessionId"]
        assert (await start(waiting))["type"] == "queue"
        error = await silent.next("error", timeout=20)  # the default deadline: 8 s
        assert error["code"] == "offer_timeout", error
        assert 6.0 < time.monotonic() - opened_at < 14.0
        assert (await silent.next("session.ended"))["reason"] == "offer_timeout"
        started = await waiting.next("session.started", timeout=5)  # the slot, at once
        assert worker.sessions == {started["sessionId"]} and sid not in worker.sessions
    finally:
        await silent.close()
        await waiting.close()


async def test_the_deadline_restarts_whenever_a_browser_attaches(tmp_path: Path) -> None:
    proc = start_signaling("replica", None, tmp_path, "--offer-timeout", "1.5")
    with stopping(proc):
        fake = await fake_worker(proc, slots=2)
        carl = await client(proc, "carl")
        again = await client(proc, "carl")
        try:
            started = await start(carl)
            await carl.send(type="offer", sdp="v=0\r\n")
            assert (await carl.next("answer"))["type"] == "answer"
            await asyncio.sleep(3.0)  # an offered session lives past the deadline
            assert "session.ended" not in [m["type"] for m in carl.seen]
            await carl.close()  # a reload: the session waits, and must be offered again
            attach = {"sessionId": started["sessionId"], "resumeToken": started["resumeToken"]}
            await again.send(type="session.resume", **attach)
            assert (await again.next("session.started"))["sessionId"] == started["sessionId"]
            assert (await again.next("error", timeout=10))["code"] == "offer_timeout"
            assert (await again.next("session.ended"))["reason"] == "offer_timeout"

            # a session created over REST that nobody attached is the grace period's, not this
            bearer = token("controller", "carl")
            status, created = await rest("POST", proc, "/api/sessions", bearer, {})
            assert status == 201 and created["state"] == "assigned"
            await asyncio.sleep(3.0)
            path = f"/api/sessions/{created['sessionId']}"
            assert (await rest("GET", proc, path, bearer))[0] == 200
            assert (await rest("DELETE", proc, path, bearer))[0] == 202
        finally:
            await carl.close()
            await again.close()
            await fake.stop()


# -- requirements no worker can ever meet ------------------------------------------------------


async def test_requirements_no_worker_can_meet_get_no_capacity_at_once(replica: Process) -> None:
    early = await client(replica, "early")
    asker = await client(replica, "asker")
    fake: FakeWorker | None = None
    try:
        # no worker registered yet: a fleet scaling up from zero, the session waits for it
        assert (await start(early, labels=["gpu"]))["type"] == "queue"
        fake = await fake_worker(
            replica, labels=("gpu",), region="eu",
            capabilities={"codecs": ["H264"], "resolution": "1280x720"},
        )  # fmt: skip
        assert (await early.next("session.started"))["workerId"] == "fake-1"
        for unmet in (
            {"labels": ["tpu"]},
            {"region": "us"},
            {"codec": "AV1"},
            {"resolution": "1920x1080"},  # above the worker's maximum
        ):
            began = time.monotonic()
            error = await start(asker, **unmet)
            assert (error["type"], error.get("code")) == ("error", "no_capacity"), (unmet, error)
            assert (await asker.next("session.ended"))["reason"] == "no_capacity"
            assert time.monotonic() - began < 3.0
        status, body = await rest(
            "POST", replica, "/api/sessions", asker.token or "", {"requirements": {"codec": "AV1"}}
        )
        assert (status, body.get("code")) == (503, "no_capacity")
        # what the (busy) worker can serve still waits for it
        assert (await start(asker, labels=["gpu"], resolution="1280x720"))["type"] == "queue"
    finally:
        await early.close()
        await asker.close()
        if fake is not None:
            await fake.stop()


async def test_a_resolution_beyond_the_protocol_is_a_bad_message(
    replica: Process, worker: FakeWorker
) -> None:
    browser = await client(replica, "greedy")
    try:
        error = await start(browser, resolution="99999x99999")
        assert (error["type"], error.get("code")) == ("error", "bad_message"), error
        assert (await start(browser))["type"] == "session.started"  # the socket still serves
        status, body = await rest(
            "POST", replica, "/api/sessions", browser.token or "",
            {"requirements": {"resolution": "99999x99999"}},
        )  # fmt: skip
        assert (status, body.get("code")) == (400, "bad_message")
    finally:
        await browser.close()
