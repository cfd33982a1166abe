"""`--encoder replay`: a clip rendered and encoded once, replayed in a loop for load tests."""

from __future__ import annotations

import av
import numpy as np

from render_server.backends.choice import choose_backends
from render_server.config import Resolution, StreamConfig
from render_server.encode.replay import ReplayEncoder, replay_clip
from render_server.render.scene import Scene
from render_server.tools.viewer import Viewer

from .support import ServerFactory, ws_url

SIZE = Resolution(320, 240)


def test_the_clip_is_real_video_that_loops_from_its_idr(scene: Scene) -> None:
    clip = replay_clip(scene, SIZE, 30.0, 1_000_000)
    assert clip is replay_clip(scene, SIZE, 30.0, 1_000_000), "built once per process"
    assert len(clip.units) == 60
    encoder = ReplayEncoder(clip)
    decoder = av.CodecContext.create("h264", "r")
    pictures = []
    keyframes = []
    for i in range(150):
        packet = encoder.encode(None, i * 3000, keyframe=i == 100)  # type: ignore[arg-type]
        assert packet.pts == i * 3000
        keyframes.append(packet.is_keyframe)
        pictures += [f.to_ndarray(format="gray") for f in decoder.decode(packet)]
    assert len(pictures) == 150 and pictures[0].shape == (240, 320)
    # an IDR at the start of every loop and on request, nowhere else
    assert [i for i, k in enumerate(keyframes) if k] == [0, 60, 100]
    assert encoder.loops == 2
    # the camera moves: frames differ, and the loop point repeats the first picture
    assert np.abs(pictures[1].astype(int) - pictures[30]).mean() > 2
    assert np.array_equal(pictures[60], pictures[0])
    # a new encoder (a new session) shares the clip and starts at its IDR
    assert ReplayEncoder(clip).encode(None, 0).is_keyframe  # type: ignore[arg-type]


def test_replay_needs_no_gpu_and_says_what_it_is() -> None:
    backends = choose_backends("auto", "replay")
    assert (backends.renderer, backends.encoder) == ("cpu", "replay")
    assert "clip" in backends.encoder_reason


async def test_a_replay_worker_streams_the_clip_at_the_full_rate(
    start_server: ServerFactory,
) -> None:
    stream = StreamConfig(resolution=SIZE, fps=30.0, encoder="replay", bitrate=1_000_000)
    server = await start_server(stream=stream)
    async with Viewer(ws_url(server)) as viewer:
        frames = [await viewer.next_frame(timeout=20) for _ in range(40)]
    assert {(f.width, f.height) for f in frames} == {(320, 240)}
    # no input, yet every frame is new: a still camera does not slow a replay down
    pictures = [f.to_ndarray(format="gray").astype(int) for f in frames[-10:]]
    assert np.abs(pictures[0] - pictures[-1]).mean() > 1


def test_the_configured_bitrate_is_the_clips(scene: Scene) -> None:
    clip = replay_clip(scene, Resolution(640, 360), 30.0, 2_000_000)
    seconds = len(clip.units) / 30.0
    mbps = clip.bytes_per_loop * 8 / seconds / 1e6
    assert 1.0 < mbps < 3.0, mbps
