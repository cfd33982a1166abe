"""A still session that receives one move renders that move's frame at once: the worker's own
timing records (a real `render-server serve`, a real aiortc peer) show the frame's render
starting within 8 ms of the input's arrival (or of the handing over of a repeat that was being
made when it came; one move of six may take up to half a frame interval), where the old pacing
waited up to a frame interval (33 ms) behind the last repeat of the still picture (100 ms
apart)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from render_server.protocol.timing import now_ms
from render_server.tools.measure.client import LatencyClient

from .browser import serve_process

MOVES = 6
# a quarter of a frame interval at 30 fps: far from a tick's wait, and clear of this shared
# machine's scheduling noise (1-3 ms; 2 ms failed now and then, before and after this bound)
LIMIT_MS = 8.0
# one move may be late by a thread hop on a loaded machine (CI saw 10.2 ms once), never by a
# tick: the old pacing's waits spread evenly over a frame interval (0-33 ms), so five of six
# under 8 ms and all under half an interval fails it nearly always
OUTLIER_LIMIT_MS = 1000 / 30 / 2


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("first-move") / "serve.log"
    # 10 repeats a second while still: a move lands anywhere between two of them
    with serve_process(
        "--resolution", "640x360", "--fps", "30", "--idle-fps", "10", log_path=log
    ) as url:  # fmt: skip
        yield url


async def test_one_move_after_stillness_starts_its_frame_at_once(server: str) -> None:
    async with LatencyClient(server, decode="none") as client:
        waits: list[float] = []
        behind: list[float] = []  # how long a frame in progress held each move
        for seq in range(1, MOVES + 1):
            await asyncio.sleep(0.5 + 0.037 * seq)  # still; a different phase each time
            client.matcher.input_sent(seq, now_ms())
            client.send(
                {"type": "pointer", "action": "move", "x": 0.5, "y": 0.5, "dx": 0.02,
                 "dy": 0.0, "buttons": 1, "seq": seq}
            )  # fmt: skip
            record = None
            for _ in range(100):  # the records come about every 100 ms
                await asyncio.sleep(0.02)
                record = next((r for r in client.matcher.records.values() if r.seq == seq), None)
                if record is not None:
                    break
            assert record is not None and record.input_ms is not None, f"no frame showed {seq}"
            # a frame being made as the input came (a repeat) is handed over first, as the
            # track documents: the move's frame starts then (the test's moves follow the
            # worker's timing batches, which share a grid with its frame ticks, so a move can
            # land on a repeat every run)
            earlier = [r.handed_ms for r in client.matcher.records.values()
                       if r.start_ms < record.start_ms]  # fmt: skip
            free = max([record.input_ms, *earlier])
            waits.append(record.start_ms - free)
            behind.append(free - record.input_ms)
        print(f"input arrival (or the end of the frame in progress) → render start, ms: "
              f"{[round(w, 2) for w in waits]}; held by a frame in progress, ms: "
              f"{[round(b, 2) for b in behind]}")  # fmt: skip
        assert all(0 <= w <= OUTLIER_LIMIT_MS for w in waits), waits
        assert sum(w > LIMIT_MS for w in waits) <= 1, waits
