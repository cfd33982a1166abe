"""No thread of ours runs real-time, whatever a codec library does as it opens (SVT-AV1 run by
root switches the opening thread, and so the threads it starts, to SCHED_FIFO 99)."""

from __future__ import annotations

import os
import threading

import pytest

from render_server.config import Resolution
from render_server.encode.av1 import create_svtav1_encoder
from render_server.thread_policy import demote_realtime_threads

REALTIME = (os.SCHED_FIFO, os.SCHED_RR)


def realtime_threads() -> list[int]:
    tids = [int(t) for t in os.listdir("/proc/self/task")]
    return [t for t in tids if os.sched_getscheduler(t) in REALTIME]


def test_a_real_time_thread_goes_back_to_the_normal_scheduler() -> None:
    done = threading.Event()
    ready = threading.Event()
    native: list[int] = []

    def park() -> None:
        native.append(threading.get_native_id())
        ready.set()
        done.wait(10)

    thread = threading.Thread(target=park)
    thread.start()
    ready.wait(5)
    try:
        os.sched_setscheduler(native[0], os.SCHED_FIFO, os.sched_param(10))
    except PermissionError:
        done.set()
        pytest.skip("no permission to make a thread real-time here: nothing to demote")
    try:
        assert native[0] in realtime_threads()
        assert demote_realtime_threads() >= 1
        assert realtime_threads() == []
        assert os.sched_getscheduler(native[0]) == os.SCHED_OTHER
    finally:
        done.set()
        thread.join(5)


def test_opening_svt_av1_leaves_no_thread_real_time() -> None:
    encoder = create_svtav1_encoder(Resolution(320, 240), 30, 500_000)
    try:
        assert realtime_threads() == [], "a thread runs real-time after SVT-AV1 opened"
        assert os.sched_getscheduler(0) == os.SCHED_OTHER
    finally:
        encoder.close()
