"""The worker pod's `preStop` hook: `render-server drain` drains a real worker process through its
status port, waits for its sessions to move, and the kubelet's SIGTERM that follows changes
nothing; a caller outside the pod cannot drain it."""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from render_server.worker.status_server import _loopback

from .browser import free_port
from .fake_signaling import FakeSignaling, sid
from .test_worker_drain import ROOT, assert_clean_exit, fake, open_sessions, worker_process

__all__ = ["fake"]  # the fixture, imported for this module's tests


def outside_address() -> str | None:
    """An address of this machine that is not loopback (the pod's own IP, as it were)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))  # no packet is sent: only a route is chosen
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if _loopback(address) else address


async def drain_command(port: int, timeout_s: float) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "render_server", "drain", "--port", str(port),
        "--timeout", str(timeout_s), cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip


async def test_prestop_drains_the_worker_and_the_sigterm_after_it_changes_nothing(
    fake: FakeSignaling, tmp_path: Path
) -> None:
    port = free_port()
    extra = ("--drain-timeout", "60", "--metrics-port", str(port), "--metrics-host", "0.0.0.0")
    async with worker_process(fake, tmp_path, *extra) as (proc, stderr):
        await fake.wait_for("worker.register", timeout=120)
        await open_sessions(fake, 20, 21)

        address = outside_address()
        if address is not None:  # from outside the pod: refused, and nothing drains
            request = urllib.request.Request(f"http://{address}:{port}/drain", method="POST")
            with pytest.raises(urllib.error.HTTPError) as refused:
                await asyncio.to_thread(urllib.request.urlopen, request, timeout=5)
            assert refused.value.code == 403
            assert b"loopback" in refused.value.read()
            assert not fake.of_type("worker.draining")
        else:
            print("no non-loopback address here: the refusal from outside is not tried")

        hook = await drain_command(port, 30)
        draining = (await fake.wait_for("worker.draining"))[0]
        assert draining["reason"] == "prestop" and draining["deadlineS"] > 50
        await fake.wait_for("session.handoff", count=2)
        await asyncio.sleep(0.5)
        assert hook.returncode is None  # the hook waits while sessions are left
        for n in (20, 21):
            await fake.send({"type": "session.close", "sessionId": sid(n), "reason": "moved"})
        out, _ = await asyncio.wait_for(hook.communicate(), 20)
        print(out.decode())
        assert hook.returncode == 0, out
        assert b"draining: 2 session(s)" in out
        assert b"drained: no session left" in out or b"the worker has exited" in out
        await fake.wait_for("worker.leaving", reason="drained", timeout=15)
        if proc.returncode is None:  # the kubelet's SIGTERM comes after the hook
            proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), 20)
    assert_clean_exit(code, stderr)
    assert len(fake.of_type("worker.draining")) == 1


async def test_the_hook_says_when_no_worker_answers() -> None:
    hook = await drain_command(free_port(), 1)
    out, _ = await asyncio.wait_for(hook.communicate(), 30)
    assert hook.returncode == 2 and b"no worker answers" in out, out


def test_only_loopback_callers_may_drain() -> None:
    assert _loopback("127.0.0.1") and _loopback("::1") and _loopback("127.5.0.1")
    assert not _loopback("10.1.2.3") and not _loopback("::ffff:10.1.2.3")
    assert not _loopback(None) and not _loopback("unix-peer")
