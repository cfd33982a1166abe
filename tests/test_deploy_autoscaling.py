"""The workers' autoscaling query is real: Debian's `prometheus` scrapes a signaling replica (on
Redis) and two worker processes, browsers take slots and queue, and the query of the rendered
ScaledObject (deploy/k8s, read from `kubectl kustomize`'s output, not copied here) returns the
worker count KEDA would run. `promtool check config` passes on the scrape configuration."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from .browser import free_port
from .deploy_manifests import documents, kubectl, one, prepared_tree, render
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

pytestmark = [
    pytest.mark.skipif(kubectl() is None, reason="kubectl (Debian's kubernetes-client) is missing"),
    pytest.mark.skipif(shutil.which("prometheus") is None, reason="Debian's prometheus is missing"),
]

SLOTS = 2  # each worker's, as deploy/k8s/base/worker.yaml has it
PLACEMENT_ONLY = ("--max-sessions-per-address", "0", "--offer-timeout", "300")
SCRAPE_S = 1


def scaled_object_query(tmp_path: Path) -> str:
    docs = documents(render(prepared_tree(tmp_path) / "overlays" / "gpu"))
    worker_args = one(docs, "Deployment", "render-server-worker")["spec"]["template"]["spec"][
        "containers"
    ][0]["args"]
    assert worker_args[worker_args.index("--slots") + 1] == str(SLOTS)
    (trigger,) = one(docs, "ScaledObject", "render-server-worker")["spec"]["triggers"]
    return str(trigger["metadata"]["query"])


def scrape_config(signaling: list[str], workers: list[str]) -> str:
    return json.dumps(  # JSON is YAML
        {
            "global": {"scrape_interval": f"{SCRAPE_S}s", "evaluation_interval": f"{SCRAPE_S}s"},
            "scrape_configs": [
                {"job_name": "render-server-signaling", "static_configs": [{"targets": signaling}]},
                {"job_name": "render-server-worker", "static_configs": [{"targets": workers}]},
            ],
        }
    )


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """(the config file to write before start, the server's URL), started by `start`."""
    yield tmp_path / "prometheus.yml", f"http://127.0.0.1:{free_port()}"


def start_prometheus(config: Path, url: str, data: Path) -> subprocess.Popen[bytes]:
    checked = subprocess.run(
        ["promtool", "check", "config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    address = url.removeprefix("http://")
    log = open(data.parent / "prometheus.log", "wb")  # noqa: SIM115 (closed with the process)
    proc = subprocess.Popen(
        ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={data}",
         f"--web.listen-address={address}", "--storage.tsdb.retention.time=1h"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(url + "/-/ready", timeout=2) as response:
                if response.status == 200:
                    return proc
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError((data.parent / "prometheus.log").read_text()[-3000:])
        time.sleep(0.2)


def query(url: str, promql: str) -> float | None:
    request = url + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(request, timeout=5) as response:
        doc = json.load(response)
    assert doc["status"] == "success", doc
    result = doc["data"]["result"]
    return float(result[0]["value"][1]) if result else None


async def settles_at(url: str, promql: str, expected: float, timeout: float = 30) -> None:
    """The query returns `expected` within `timeout` (a few scrapes) and still does after two
    more scrapes."""
    deadline = time.monotonic() + timeout
    seen: list[float | None] = []
    while True:
        value = await asyncio.to_thread(query, url, promql)
        seen.append(value)
        if value == expected:
            await asyncio.sleep(2 * SCRAPE_S + 0.5)
            value = await asyncio.to_thread(query, url, promql)
            assert value == expected, seen + [value]
            return
        assert time.monotonic() < deadline, f"wanted {expected}, the query gave {seen[-10:]}"
        await asyncio.sleep(0.5)


async def test_the_scaled_objects_query_asks_for_the_workers_the_load_needs(
    tmp_path: Path, prometheus: tuple[Path, str]
) -> None:
    promql = scaled_object_query(tmp_path)
    config, url = prometheus
    with redis_server() as redis:
        replica = start_signaling("signaling", redis, tmp_path, *PLACEMENT_ONLY)
        with stopping(replica):
            ports = [free_port(), free_port()]
            workers: list[Process] = [
                start_worker(f"worker-{i}", replica, tmp_path, SLOTS, "--metrics-port", str(port))
                for i, port in enumerate(ports)
            ]
            with stopping(*workers):
                wait_for_workers(replica, 2, workers)
                config.write_text(
                    scrape_config([f"127.0.0.1:{replica.port}"], [f"127.0.0.1:{p}" for p in ports])
                )
                server = start_prometheus(config, url, tmp_path / "tsdb")
                try:
                    await _load_and_watch(replica, url, promql)
                finally:
                    server.terminate()
                    server.wait(20)


async def _load_and_watch(replica: Process, url: str, promql: str) -> None:
    # every target is scraped: the two workers' status ports and the replica
    await settles_at(url, 'count(up{job=~"render-server-.*"} == 1)', 3)
    # each of the three processes exports how late its event loop runs (the dashboard's panel)
    await settles_at(url, "count(python_event_loop_lag_seconds_count > 0)", 3)
    await settles_at(url, promql, 1)  # idle: one worker keeps 2 spare slots
    browsers = [SignalClient(replica.ws, token("controller", f"user-{i}")) for i in range(6)]
    await asyncio.gather(*(b.connect() for b in browsers))
    try:
        for b in browsers[:3]:
            await b.send(type="session.start")
            assert (await b.next("session.started", "queue"))["type"] == "session.started"
        await settles_at(url, promql, 3)  # (3 in use + 0 queued + 2 spare) / 2, rounded up
        for b in browsers[3:]:
            await b.send(type="session.start")
        kinds = [(await b.next("session.started", "queue"))["type"] for b in browsers[3:]]
        assert sorted(kinds) == ["queue", "queue", "session.started"]
        await settles_at(url, promql, 4)  # (4 in use + 2 queued + 2 spare) / 2
        for b in browsers:
            await b.send(type="session.end")
        await settles_at(url, promql, 1)
    finally:
        await asyncio.gather(*(b.close() for b in browsers))
