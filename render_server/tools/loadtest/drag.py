"""A designer's drag, seeded: the pointer events one load-test stream sends on its data channel.

The worker renders a frame only when the camera moved (a still picture repeats at its
`--idle-fps`), so a harness that sends nothing measures repeats, not rendering. Each stream
orbits the camera with the left button held, as in docs/data-channel.md: moves come at twice
the frame rate (a mouse reports at 60–125 Hz), their direction wanders smoothly, and the
button is released and pressed again between strokes without a pause, so no tick finds the
camera still. The pattern depends only on the seed and the stream's index: a rerun sends the
same gestures.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable, Iterator
from typing import Any, Final

MAX_INPUT_HZ: Final = 240.0  # well under the worker's 500 messages a second per session
STROKE_S: Final = (1.0, 4.0)  # how long one press lasts
SPEED: Final = (0.2, 0.8)  # heights per second: a drag across the height turns 180°
MAX_PITCH_DRIFT: Final = 0.15  # heights of vertical travel either way, so pitch never clamps


def input_hz(fps: float) -> float:
    """Moves per second: two per frame, so every frame interval holds one."""
    return min(2.0 * fps, MAX_INPUT_HZ)


def drag_events(seed: int, index: int, hz: float) -> Iterator[dict[str, Any]]:
    """Endless pointer messages of stream `index`, one per tick of `hz` (a move, or an up
    followed on the same tick by the next stroke's down)."""
    rng = random.Random(f"{seed}:{index}")
    x, y, pitch = 0.5, 0.5, 0.0
    heading = rng.uniform(-math.pi, math.pi)
    while True:
        yield {"type": "pointer", "action": "down", "x": x, "y": y, "buttons": 1}
        speed = rng.uniform(*SPEED) / hz
        for _ in range(max(1, round(rng.uniform(*STROKE_S) * hz))):
            heading += rng.gauss(0.0, 0.15)
            dx = speed * math.cos(heading)
            # always some yaw, so that every move changes the camera
            dx = dx if abs(dx) >= speed / 4 else math.copysign(speed / 4, dx or 1.0)
            dy = speed * math.sin(heading)
            if abs(pitch + dy) > MAX_PITCH_DRIFT:
                dy = -dy
                heading = -heading
            pitch += dy
            x = min(1.0, max(0.0, x + dx))
            y = min(1.0, max(0.0, y + dy))
            yield {"type": "pointer", "action": "move", "x": round(x, 4), "y": round(y, 4),
                   "dx": round(dx, 5), "dy": round(dy, 5), "buttons": 1}  # fmt: skip
        yield {"type": "pointer", "action": "up", "x": x, "y": y, "buttons": 0}


async def drag(send: Callable[[dict[str, Any]], None], seed: int, index: int, fps: float) -> None:
    """Send stream `index`'s drag until cancelled; the button is released on the way out."""
    hz = input_hz(fps)
    period = 1.0 / hz
    start = time.monotonic()
    tick = 0
    events = drag_events(seed, index, hz)
    try:
        while True:
            event = next(events)
            send(event)
            if event["action"] == "up":
                continue  # the next stroke's down goes on the same tick
            if event["action"] == "move":
                tick += 1
                delay = start + tick * period - time.monotonic()
                if delay < -1.0:  # far behind (a stalled loop): no burst to catch up
                    start, tick = time.monotonic(), 0
                await asyncio.sleep(max(0.0, delay))
    finally:
        send({"type": "pointer", "action": "up", "x": 0.5, "y": 0.5, "buttons": 0})
