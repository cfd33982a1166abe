"""docker/nginx.conf in front of two real signaling replicas on Redis, run by Debian's nginx:
the page, the REST API and browsers' WebSockets pass through it; an upload larger than the
other routes' body limit reaches /api/scenes, streamed (not spooled to a file), while the same
body elsewhere is refused by nginx; when one replica is killed, new sockets and REST calls go to
the other, and the worker (given both replicas) is placed through it again. Only the Compose
service names are swapped for this machine's ports."""

from __future__ import annotations

import asyncio
import http.client
import re
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from .browser import free_port
from .deploy_manifests import ROOT
from .processes import (
    Process,
    SignalClient,
    start_signaling,
    start_worker,
    stopping,
    token,
    wait_for_workers,
)
from .redis_server import redis_server

pytestmark = pytest.mark.skipif(shutil.which("nginx") is None, reason="Debian's nginx is missing")

PLACEMENT_ONLY = ("--max-sessions-per-address", "0", "--offer-timeout", "300")
# nginx's own words in its error log for a body over a location's client_max_body_size (which
# it answers 413 itself, never passing it on)
TOO_LARGE = "client intended to send too large body"


def nginx_config(tmp_path: Path, replicas: list[Process], port: int) -> Path:
    site = (ROOT / "docker" / "nginx.conf").read_text()
    for i, replica in enumerate(replicas, start=1):
        site = site.replace(f"server signaling-{i}:8080", f"server 127.0.0.1:{replica.port}")
    assert "signaling-" not in site.split("upstream signaling", 1)[1].split("}", 1)[0]
    site = site.replace("listen 8080;", f"listen 127.0.0.1:{port};")
    temp = tmp_path / "nginx"
    temp.mkdir()
    config = tmp_path / "nginx-main.conf"
    config.write_text(
        f"daemon off;\npid {temp}/nginx.pid;\nerror_log {temp}/error.log info;\n"
        "events { worker_connections 256; }\n"
        f"http {{\n  access_log off;\n  client_body_temp_path {temp}/body;\n"
        f"  proxy_temp_path {temp}/proxy;\n  fastcgi_temp_path {temp}/fastcgi;\n"
        f"  uwsgi_temp_path {temp}/uwsgi;\n  scgi_temp_path {temp}/scgi;\n{site}\n}}\n"
    )
    return config


@pytest.fixture
def nginx_process() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.terminate()
        proc.wait(10)


def up(url: str, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)


def sockets(replica: Process) -> float:
    """The replica's open signaling sockets, from its /metrics."""
    with urllib.request.urlopen(replica.url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    return float(re.search(r"^signaling_connections (\S+)$", text, re.M).group(1))  # type: ignore[union-attr]


def post(port: int, path: str, body: bytes, headers: dict[str, str]) -> int:
    """POST `body` through nginx; the status (nginx may answer 413 before it reads the body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        try:
            conn.request("POST", path, body=body, headers=headers)
        except (BrokenPipeError, ConnectionResetError):
            pass  # it answered before taking the whole body: its answer is still there to read
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def nginx_says(log: Path, since: int) -> str:
    return log.read_text()[since:]


def spooled(said: str) -> bool:
    """Whether nginx wrote (or, its workers being another user than the test's, tried to write)
    a request body to a temporary file rather than stream it."""
    return "a client request body is buffered to a temporary file" in said or "/body/0" in said


def check_uploads_pass_and_other_big_bodies_do_not(port: int, log: Path) -> None:
    """1 MiB: over the generic limit (64k), far under /api/scenes' (256m). Only whether nginx
    itself refused or spooled it is looked at: the replica may answer as it will."""
    model = b"v 0 0 0\nv 1 0 0\nv 0 1 0\nf 1 2 3\n"
    body = model + b"# padding\n" * ((1024 * 1024 - len(model)) // 10)
    upload = {"Authorization": f"Bearer {token('controller', 'designer')}",
              "Content-Type": "model/obj"}  # fmt: skip
    since = len(log.read_text())
    status = post(port, "/api/scenes", body, upload)
    said = nginx_says(log, since)
    # the replica's answer (201, or its own 4xx), not nginx's 413 nor a 5xx of its own
    assert TOO_LARGE not in said and status != 413 and status < 500, (status, said)
    assert not spooled(said), said  # streamed to the replica as it came
    # the same body to another route: nginx's 413, the replica never sees it
    json_body = upload | {"Content-Type": "application/json"}
    since = len(log.read_text())
    assert post(port, "/api/sessions", body, json_body) == 413
    assert TOO_LARGE in nginx_says(log, since)
    # elsewhere a body under the generic limit but over nginx's memory buffer is spooled: what
    # `spooled` looks for is what this nginx writes, so its absence above means something
    since = len(log.read_text())
    post(port, "/api/sessions", b"{}" + b" " * 48 * 1024, json_body)
    assert spooled(nginx_says(log, since))


async def start_through(url: str, name: str) -> tuple[SignalClient, dict[str, str]]:
    browser = SignalClient(url, token("controller", name))
    await browser.connect()
    await browser.send(type="session.start")
    return browser, await browser.next("session.started", "queue", "error", timeout=20)


async def test_nginx_passes_websockets_to_either_replica_and_around_a_dead_one(
    tmp_path: Path, nginx_process: list[subprocess.Popen[bytes]]
) -> None:
    with redis_server() as redis:
        scenes = tmp_path / "scenes"  # one folder both replicas share, as Compose's volume
        replicas = [
            start_signaling(
                f"replica-{i}", redis, tmp_path, *PLACEMENT_ONLY, "--scene-dir", str(scenes)
            )
            for i in (1, 2)
        ]
        with stopping(*replicas):
            worker = start_worker(
                "worker",
                replicas[0],
                tmp_path,
                4,
                "--signaling",
                replicas[1].ws.replace("/ws", "/worker"),
            )
            with stopping(worker):
                wait_for_workers(replicas[1], 1, [worker])
                port = free_port()
                config = nginx_config(tmp_path, replicas, port)
                checked = subprocess.run(
                    ["nginx", "-t", "-c", str(config)], capture_output=True, text=True
                )
                assert checked.returncode == 0, checked.stderr
                proxy = subprocess.Popen(["nginx", "-c", str(config)], stderr=subprocess.DEVNULL)
                nginx_process.append(proxy)
                base = f"http://127.0.0.1:{port}"
                up(base + "/healthz", proxy)
                with urllib.request.urlopen(base + "/", timeout=5) as page:
                    assert b"<html" in page.read().lower()  # the page through the proxy
                check_uploads_pass_and_other_big_bodies_do_not(
                    port, tmp_path / "nginx" / "error.log"
                )
                ws = f"ws://127.0.0.1:{port}/ws"

                # round robin: four browsers land on both replicas, each placed at once
                before = [sockets(r) for r in replicas]
                browsers = [await start_through(ws, f"user-{i}") for i in range(4)]
                try:
                    assert [m["type"] for _, m in browsers] == ["session.started"] * 4, browsers
                    now = [sockets(r) for r in replicas]
                    assert all(n > b for n, b in zip(now, before, strict=True)), (before, now)
                    for browser, _ in browsers:  # their slots free again
                        await browser.send(type="session.end")
                        await browser.next("session.ended")
                finally:
                    await asyncio.gather(*(b.close() for b, _ in browsers))

                replicas[0].kill()  # one replica dies: nginx sends new sockets to the other
                replicas[0].process.wait(10)
                # the worker was registered through the dead one: it is placed again through
                # the other, and sessions queued meanwhile start
                for i in range(4):
                    browser, message = await start_through(ws, f"after-{i}")
                    try:
                        if message["type"] == "queue":
                            message = await browser.next("session.started", timeout=30)
                        assert message["type"] == "session.started", message
                        await browser.send(type="session.end")
                        await browser.next("session.ended")
                    finally:
                        await browser.close()
