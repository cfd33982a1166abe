"""The video track's pacing around stillness (transport/track.py): a still picture repeats at the
idle rate, and the first move after it starts a frame at once, not a frame interval after the
last repeat; input that arrives while a frame is being made starts the next one as soon as that
frame is handed over; between frames that show something new, the frame-rate cap holds.

A frame source of the test's own stands in for the pipeline (the joint the track names,
`FrameSource`); times are the event loop's, and the thresholds sit far from both outcomes (a
frame that waits for the next tick waits tens of milliseconds)."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import av
import pytest
from aiortc.mediastreams import MediaStreamError

from render_server.ticks import next_on_grid, on_grid
from render_server.transport.track import WAKE_SLACK, EncodedVideoTrack

FPS = 30.0
IDLE_FPS = 10.0  # repeats 100 ms apart: a move lands far from the next tick
INTERVAL = 1 / FPS


@dataclass
class Source:
    """Pictures numbered by the camera (an int); a repeat takes `repeat_s` to "encode"."""

    repeat_s: float = 0.0
    last: int | None = None
    starts: list[tuple[float, int, bool]] = field(default_factory=list)  # (time, camera, repeat)
    ends: list[float] = field(default_factory=list)

    cheap = False

    def is_still(self, camera: int) -> bool:
        return camera == self.last

    def produce(self, camera: int, pts: int) -> av.Packet:
        repeat = camera == self.last
        self.starts.append((time.monotonic(), camera, repeat))
        if repeat and self.repeat_s:
            time.sleep(self.repeat_s)
        self.last = camera
        self.ends.append(time.monotonic())
        return av.Packet(b"\x00\x00\x00\x01\x65")


class Harness:
    def __init__(self, source: Source, fps: float = FPS) -> None:
        self.source = source
        self.camera = 0
        self.executor = ThreadPoolExecutor(1)
        self.track = EncodedVideoTrack(
            source, fps, lambda dt: self.camera, self.executor, idle_fps=IDLE_FPS
        )
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Harness:
        async def pull() -> None:
            while True:
                await self.track.recv()

        self._task = asyncio.create_task(pull())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        self.track.stop()
        self.executor.shutdown(wait=True)

    def move(self) -> float:
        """A new camera, and the track poked as the input channel does; when it happened."""
        self.camera += 1
        at = time.monotonic()
        self.track.poke()
        return at

    def start_of(self, camera: int) -> float:
        return next(t for t, c, repeat in self.source.starts if c == camera and not repeat)


async def test_the_first_move_after_stillness_starts_a_frame_at_once() -> None:
    source = Source()
    async with Harness(source) as h:
        delays = []
        for _ in range(5):
            await asyncio.sleep(0.35)  # still: a few repeats went out
            # just after a repeat, when the old rule waited one frame interval
            repeats = len(source.starts)
            while len(source.starts) == repeats:
                await asyncio.sleep(0.001)
            at = h.move()
            await asyncio.sleep(0.05)
            delays.append(h.start_of(h.camera) - at)
    assert sum(1 for *_, repeat in source.starts if repeat) >= 10  # stillness repeated
    assert max(delays) < 0.010, [round(d * 1e3, 1) for d in delays]


async def test_a_move_during_a_repeat_starts_the_next_frame_when_it_is_handed_over() -> None:
    source = Source(repeat_s=0.015)
    async with Harness(source) as h:
        waits = []
        for _ in range(4):
            await asyncio.sleep(0.35)
            repeats = len(source.starts)
            while len(source.starts) == repeats:  # a repeat has started "encoding"
                await asyncio.sleep(0.0005)
            h.move()
            await asyncio.sleep(0.06)
            start = h.start_of(h.camera)
            repeat_end = max(e for e in source.ends if e <= start)
            waits.append(start - repeat_end)
    # not the next tick (a frame interval or the idle interval later)
    assert max(waits) < 0.010, [round(w * 1e3, 1) for w in waits]


async def test_frames_that_show_new_input_keep_the_frame_rate_cap() -> None:
    source = Source()
    async with Harness(source) as h:
        await asyncio.sleep(0.2)
        end = time.monotonic() + 0.5
        while time.monotonic() < end:  # input far faster than the frame rate
            h.move()
            await asyncio.sleep(0.002)
        await asyncio.sleep(0.05)
    new = [t for t, _, repeat in source.starts if not repeat][1:]
    gaps = [b - a for a, b in zip(new, new[1:], strict=False)]
    assert len(new) >= 10
    assert min(gaps) > INTERVAL * 0.8, [round(g * 1e3, 1) for g in gaps]


async def test_tracks_out_of_step_tick_together_on_the_grid() -> None:
    """Ticks without input fall on multiples of the frame interval of the loop's clock, so
    sessions started at any moment wake the event loop together (render_server/ticks.py)."""
    first, second = Source(), Source()
    async with Harness(first) as a:
        await asyncio.sleep(INTERVAL * 0.4)  # out of step by 40 % of an interval
        async with Harness(second) as b:
            await asyncio.sleep(0.4)
            ticks = [a.track._next_tick, b.track._next_tick]
    for tick in ticks:
        assert tick is not None
        assert abs(tick / INTERVAL - round(tick / INTERVAL)) < 1e-6, tick
    assert ticks[0] == pytest.approx(ticks[1]) or abs(ticks[0] - ticks[1]) == pytest.approx(
        INTERVAL
    )  # the same grid point, or its neighbour if one was read a tick later


def test_grid_points() -> None:
    assert on_grid(0.95, 0.1) == pytest.approx(1.0)
    assert on_grid(1.0 + 1e-9, 0.1) == pytest.approx(1.0)  # on the grid, not the next point
    assert next_on_grid(1.001, 0.1) == pytest.approx(1.1)  # woken on a point: the next one
    assert next_on_grid(1.0, 0.1) == pytest.approx(1.1)
    assert next_on_grid(0.999, 0.1) == pytest.approx(1.1)  # woken early: still the next one


@pytest.mark.parametrize(
    ("fps", "busy_ms", "every_ms"), [(60.0, 0.0, 3.0), (60.0, 1.0, 3.0), (30.0, 6.0, 4.0)]
)
async def test_a_long_move_keeps_the_frame_rate(
    fps: float, busy_ms: float, every_ms: float
) -> None:
    """A drag pokes the track far faster than the frame rate, so every new frame waits out the
    cap and the event loop wakes it late (epoll rounds its timeout up to the next millisecond;
    `busy_ms`: other sessions hold the loop that long every `every_ms` ms, as a loaded worker
    sends every session's frame of a tick in turn). Counted from each late start, every frame
    pushed the later ones back: a 60 fps drag lost 3-6 frames in 120, and with 2 ms of lateness
    forgiven, a 30 fps one held up to 6 ms at a time lost 2 in 60."""
    seconds = 2.0
    source = Source()
    async with Harness(source, fps) as h:
        loop = asyncio.get_running_loop()
        busy_until = time.monotonic() + seconds + 0.3

        def busy() -> None:
            time.sleep(busy_ms / 1e3)
            if time.monotonic() < busy_until:
                loop.call_later(every_ms / 1e3, busy)

        if busy_ms:
            loop.call_soon(busy)
        await asyncio.sleep(0.2)
        start = time.monotonic()
        while time.monotonic() < start + seconds:
            h.move()
            await asyncio.sleep(0.004)
        end = time.monotonic()
    new = [t for t, _, repeat in source.starts if not repeat and start <= t < end]
    gaps = [b - a for a, b in zip(new, new[1:], strict=False)]
    shown = (len(new), [round(g * 1e3, 1) for g in gaps])
    assert 0.985 * fps * seconds <= len(new) <= fps * seconds + 2, shown
    # the cap still holds: never two new frames closer than the slack allows, and mostly a
    # whole interval apart (times are taken on the encoding thread, which the machine may hold
    # back now and then: a late start followed by a prompt one is no breach)
    interval = 1 / fps
    assert min(gaps) > interval * (1 - WAKE_SLACK) - 1e-3, shown
    assert sorted(gaps)[len(gaps) // 4] > interval - 3e-3, shown


async def test_a_paused_track_makes_no_frame_until_resumed_and_a_stop_wakes_it() -> None:
    source = Source()
    async with Harness(source) as harness:
        await asyncio.sleep(0.3)
        harness.track.pause()
        await asyncio.sleep(0.05)  # a frame under way when paused may finish
        made = len(source.starts)
        harness.move()  # input does not wake a paused track: nobody would see the frame
        await asyncio.sleep(0.4)
        assert len(source.starts) == made and harness.track.paused
        harness.track.resume()
        await asyncio.sleep(0.2)
        assert len(source.starts) > made and source.starts[made][1] == harness.camera
    paused = Harness(Source())
    paused.track.pause()
    recv = asyncio.create_task(paused.track.recv())
    await asyncio.sleep(0.05)
    assert not recv.done()
    paused.track.stop()
    with pytest.raises(MediaStreamError):
        await asyncio.wait_for(recv, 1)
    paused.executor.shutdown(wait=True)
