"""A worker that serves its slots from child processes (`--processes N`): sessions spread over
the children, their metrics merged, a killed child's sessions placed again and the child
restarted, no child outliving its worker. Real processes: a signaling replica, a worker with
two children, Python peers over aiortc."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from render_server.cli.option_values import processes_value
from render_server.config import ConfigError, WorkerConfig
from render_server.metrics import Metrics
from render_server.tools.following_viewer import FollowingViewer
from render_server.worker.pool_children import shares

from .browser import free_port
from .chaos import until
from .processes import run, start_signaling, start_worker, stopping, token, wait_for_workers


def test_slots_are_shared_evenly_and_no_child_gets_none() -> None:
    assert shares(5, 2) == [3, 2]
    assert shares(4, 4) == [1, 1, 1, 1]
    assert shares(2, 8) == [1, 1]  # never more children than slots


def test_processes_option_values() -> None:
    assert processes_value("3", 8) == 3
    assert processes_value("auto", 1) == 1  # at most one per slot
    assert 1 <= processes_value("AUTO", 64) <= len(os.sched_getaffinity(0))
    with pytest.raises(ConfigError, match="neither a number nor auto"):
        processes_value("many", 2)
    with pytest.raises(ConfigError, match="each serves one"):
        WorkerConfig(slots=2, processes=3)
    with pytest.raises(ConfigError, match="outside 1..64"):
        WorkerConfig(slots=256, processes=0)


def test_more_processes_than_slots_is_a_usage_error() -> None:
    done = run("serve", "--port", "0", "--slots", "2", "--processes", "3")
    assert done.returncode == 2
    assert "3 processes for 2 slots" in done.stderr


def test_the_childrens_metrics_merge_into_one_exposition() -> None:
    parent, child = Metrics(), Metrics()
    child.frames.inc(7)
    child.session_fps.labels("abcdef").set(30)
    child.frame_stage_seconds.labels("encode").observe(0.004)
    parent.children = {0: (101, child.render()), 1: (202, child.render())}
    text = parent.render().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    # each family once (Prometheus refuses a second HELP/TYPE), every child's samples in it
    assert text.count("# TYPE worker_frames_encoded_total counter") == 1
    frames = {
        s.labels.get("child_pid"): s.value
        for s in families["worker_frames_encoded"].samples
        if s.name.endswith("_total")
    }
    assert frames == {None: 0.0, "101": 7.0, "202": 7.0}
    fps = families["worker_session_fps"].samples
    both = {("0", "abcdef"), ("1", "abcdef")}
    assert {(s.labels["child"], s.labels["session"]) for s in fps} == both


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())


def _children_of_sessions(port: int) -> dict[str, str]:
    """Session label → the pid of the child serving it, from the worker's /metrics."""
    found = re.findall(
        r'^worker_session_fps\{child="\d+",child_pid="(\d+)",session="([0-9a-f]+)"\}',
        _metrics(port), re.M,
    )  # fmt: skip
    return {session: pid for pid, session in found}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_sessions_spread_over_two_children_and_a_killed_childs_come_back(
    tmp_path: Path,
) -> None:
    replica = start_signaling("replica", None, tmp_path, "--auth", "on")
    status_port = free_port()
    worker = start_worker(
        "pooled", replica, tmp_path, 2, "--processes", "2", "--metrics-port", str(status_port)
    )
    viewers = [FollowingViewer([replica.url], token("controller", f"user{i}")) for i in (1, 2)]
    with stopping(worker, replica):
        wait_for_workers(replica, 1, [worker], timeout=120)
        try:
            for viewer in viewers:
                await viewer.start()
            ids = [(v.session_id or "")[:12] for v in viewers]
            await until(lambda: set(ids) <= set(_children_of_sessions(status_port)), 15,
                        "both sessions in the worker's /metrics")  # fmt: skip
            placed = _children_of_sessions(status_port)
            pids = {placed[i] for i in ids}
            assert len(pids) == 2, f"both sessions on one child: {placed}"
            # each child froze what it loaded (aiortc, numba, trimesh: ~200k objects) out of
            # the collector's work, or each full collection would freeze its streams ~0.1 s
            frozen = _frozen_objects(status_port)
            assert set(frozen) == pids and min(frozen.values()) > 50_000, frozen

            victim, survivor = viewers
            killed_pid = int(placed[ids[0]])
            # stopped for 0.4 s first, the child ran its timers that late: its /metrics say so
            os.kill(killed_pid, signal.SIGSTOP)
            await asyncio.sleep(0.4)
            os.kill(killed_pid, signal.SIGCONT)
            await until(lambda: _late_timers(status_port).get(str(killed_pid), 0) >= 1, 15,
                        "the paused child's late timer in /metrics")  # fmt: skip
            os.kill(killed_pid, signal.SIGKILL)
            killed_at = time.monotonic()
            # the lost session is placed again (on the restarted child or the other one) and
            # streams; the other child's session never stops
            await until(lambda: victim.first_frame_after(killed_at + 0.5) is not None, 60,
                        "the killed child's session streaming again")  # fmt: skip
            kinds = [m.get("type") for _, m in victim.messages]
            assert "session.interrupted" in kinds, kinds
            await asyncio.sleep(1.0)
            now = time.monotonic()
            assert survivor.longest_gap(killed_at, now) < 1.5, "the other child's session froze"
            # the killed child is back, under a new pid
            await until(lambda: len(set(_child_pids(status_port)) - {str(killed_pid)}) == 2, 60,
                        "two live children again")  # fmt: skip
            # a frozen child (stopped, as a deadlock would leave it) is killed for its silence
            # and its session placed again too
            frozen_pid = int(_children_of_sessions(status_port)[ids[1]])
            os.kill(frozen_pid, signal.SIGSTOP)
            frozen_at = time.monotonic()
            await until(lambda: survivor.first_frame_after(frozen_at + 0.5) is not None, 60,
                        "the frozen child's session streaming again")  # fmt: skip
            assert not _alive(frozen_pid) or _zombie(frozen_pid)
        finally:
            for viewer in viewers:
                await viewer.close()
        children = [int(p) for p in _child_pids(status_port)]
        # a worker killed outright takes its children with it
        worker.kill(signal.SIGKILL)
        worker.process.wait(10)
        deadline = time.monotonic() + 15
        while any(_alive(p) for p in children) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert not any(_alive(p) for p in children), "a child outlived its killed worker"


def _zombie(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def _frozen_objects(port: int) -> dict[str, float]:
    """Child pid → the objects it froze out of its garbage collector, from /metrics."""
    found = re.findall(
        r'^python_gc_frozen_objects\{child="\d+",child_pid="(\d+)"\} (\S+)$', _metrics(port), re.M
    )
    return {pid: float(value) for pid, value in found}


def _late_timers(port: int) -> dict[str, float]:
    """Child pid → the timers its event loop ran more than 0.2 s late, from /metrics."""
    late: dict[str, float] = {}
    for family in text_string_to_metric_families(_metrics(port)):
        if family.name == "python_event_loop_lag_seconds":
            for s in family.samples:
                pid = s.labels.get("child_pid")
                if pid is not None and s.name.endswith("_count"):
                    late[pid] = late.get(pid, 0.0) + s.value
                elif pid is not None and s.labels.get("le") == "0.2":
                    late[pid] = late.get(pid, 0.0) - s.value
    return late


def _child_pids(port: int) -> list[str]:
    text = _metrics(port)
    return sorted(set(re.findall(r'child_pid="(\d+)"', text)))
