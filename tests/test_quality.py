"""Stream quality: clamping, and a pipeline that changes size, frame rate and bitrate cap."""

from __future__ import annotations

from collections.abc import Iterator

import av
import pytest

from render_server.config import Resolution, StreamConfig
from render_server.metrics import Metrics
from render_server.protocol.data_channel import QualityRequest
from render_server.render import OrbitCamera, Scene
from render_server.stream.pipeline import FramePipeline
from render_server.stream.quality import QualityLimits, StreamQuality
from render_server.stream.scene_commands import SceneEdits
from render_server.worker.local import LocalWorker

STREAM = StreamConfig(
    resolution=Resolution(320, 240), max_resolution=Resolution(640, 360), fps=30.0,
    bitrate=1_500_000,
)  # fmt: skip
LIMITS = QualityLimits.of(STREAM)
START = LIMITS.initial(STREAM)


def test_limits_come_from_the_stream_config() -> None:
    assert LIMITS == QualityLimits(Resolution(640, 360), 30.0, 1500)
    assert START == StreamQuality(Resolution(320, 240), 30.0, 1500)
    assert LIMITS.message(START) == {
        "type": "quality", "width": 320, "height": 240, "fps": 30, "maxKbps": 1500,
        "maxWidth": 640, "maxHeight": 360,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        (QualityRequest(), START),
        (QualityRequest(201, 151), StreamQuality(Resolution(200, 150), 30.0, 1500)),
        (QualityRequest(10, 10), StreamQuality(Resolution(160, 90), 30.0, 1500)),
        (QualityRequest(4000, 3000), StreamQuality(Resolution(640, 360), 30.0, 1500)),
        (QualityRequest(1000, 91), StreamQuality(Resolution(640, 90), 30.0, 1500)),
        (QualityRequest(fps=12.5), StreamQuality(Resolution(320, 240), 12.5, 1500)),
        (QualityRequest(fps=0.1), StreamQuality(Resolution(320, 240), 1.0, 1500)),
        (QualityRequest(fps=240), StreamQuality(Resolution(320, 240), 30.0, 1500)),
        (QualityRequest(max_kbps=800.9), StreamQuality(Resolution(320, 240), 30.0, 800)),
        (QualityRequest(max_kbps=5), StreamQuality(Resolution(320, 240), 30.0, 100)),
        (QualityRequest(max_kbps=1e6), StreamQuality(Resolution(320, 240), 30.0, 1500)),
    ],
)
def test_requests_are_clamped_and_sizes_made_even(
    request_: QualityRequest, expected: StreamQuality
) -> None:
    assert LIMITS.clamp(START, request_) == expected


def test_figures_not_asked_for_stay() -> None:
    smaller = LIMITS.clamp(START, QualityRequest(200, 150, 15.0, 700.0))
    assert LIMITS.clamp(smaller, QualityRequest(fps=20)) == StreamQuality(
        Resolution(200, 150), 20.0, 700
    )


def test_max_resolution_is_validated() -> None:
    from render_server.config import ConfigError

    with pytest.raises(ConfigError, match="max resolution"):
        StreamConfig(resolution=Resolution(1920, 1080), max_resolution=Resolution(1280, 1440))
    assert StreamConfig().max_resolution == Resolution(3840, 2160)


@pytest.fixture
def pipeline(scene: Scene) -> Iterator[FramePipeline]:
    worker = LocalWorker("w", scene, STREAM, 1, Metrics())
    built = worker._pipeline()
    yield built
    built.close()


def camera(scene: Scene) -> OrbitCamera:
    return OrbitCamera.framed_on(scene.bounds_min, scene.bounds_max)


def test_a_new_size_decodes_at_that_size_from_a_keyframe(
    pipeline: FramePipeline, scene: Scene
) -> None:
    decoder = av.CodecContext.create("h264", "r")
    cam = camera(scene)
    packets = [pipeline.produce(cam, i * 3000) for i in range(3)]
    pipeline.request_format(Resolution(200, 150), 30.0)
    packets += [pipeline.produce(cam, (3 + i) * 3000) for i in range(4)]
    sizes, keys = [], []
    for packet in packets:
        assert packet is not None
        keys.append(packet.is_keyframe)
        sizes += [(f.width, f.height) for f in decoder.decode(packet)]
    sizes += [(f.width, f.height) for f in decoder.decode(None)]
    assert sizes == [(320, 240)] * 3 + [(200, 150)] * 4  # one decoder, as a browser has
    assert keys == [True, False, False, True, False, False, False]
    assert pipeline.encoder.width == 200 and pipeline.last.keyframe is False


def test_the_bitrate_cap_holds_against_estimates_and_new_encoders(
    pipeline: FramePipeline, scene: Scene
) -> None:
    cam = camera(scene)
    pipeline.produce(cam, 0)
    assert pipeline.encoder.bitrate == 1_500_000
    pipeline.request_bitrate_cap(600_000)
    pipeline.produce(cam, 3000)
    assert pipeline.encoder.bitrate == 600_000
    pipeline.request_bitrate(10**9)  # REMB never raises it above the cap
    pipeline.produce(cam, 6000)
    assert pipeline.encoder.bitrate == 600_000
    pipeline.request_bitrate(400_000)  # below the cap: followed
    pipeline.produce(cam, 9000)
    assert pipeline.encoder.bitrate == 400_000
    pipeline.request_bitrate(10**9)
    pipeline.request_format(Resolution(160, 90), 15.0)  # the new encoder keeps the cap
    pipeline.produce(cam, 12000)
    assert (pipeline.encoder.width, pipeline.encoder.bitrate) == (160, 600_000)
    pipeline.request_bitrate_cap(None)  # cap lifted: the estimate, within the configured
    pipeline.produce(cam, 15000)
    assert pipeline.encoder.bitrate == 1_500_000
    assert pipeline.last.bitrate == 1_500_000


def test_an_edited_scene_reaches_the_picture_and_survives_a_new_size(
    pipeline: FramePipeline, scene: Scene
) -> None:
    cam = camera(scene)
    pipeline.produce(cam, 0)
    edits = SceneEdits(hidden=frozenset(range(len(scene.objects))), hours=0.0)
    pipeline.request_scene(lambda: edits.apply(scene))
    pipeline.produce(cam, 3000)
    assert pipeline.pictures.renderer.scene.triangle_count == 0  # type: ignore[attr-defined]
    pipeline.request_format(Resolution(160, 90), 30.0)
    pipeline.produce(cam, 6000)
    assert pipeline.pictures.renderer.scene.triangle_count == 0  # type: ignore[attr-defined]
    assert pipeline.pictures.renderer.width == 160  # type: ignore[attr-defined]


def test_a_format_that_cannot_be_built_leaves_the_stream_as_it_was(
    pipeline: FramePipeline, scene: Scene
) -> None:
    def no_encoder(resolution: Resolution, fps: float, scene: Scene | None, codec: str):  # type: ignore[no-untyped-def]
        raise RuntimeError("no encoder session left")

    pipeline.factory = no_encoder
    cam = camera(scene)
    pipeline.produce(cam, 0)
    pipeline.request_format(Resolution(160, 90), 30.0)
    assert pipeline.produce(cam, 3000) is not None
    assert pipeline.format_errors == 1 and pipeline.encoder.width == 320


def test_without_a_set_bitrate_each_size_gets_its_own() -> None:
    from render_server.config import default_bitrate
    from render_server.metrics import Metrics
    from render_server.render import default_scene
    from render_server.worker.local import LocalWorker

    stream = StreamConfig(resolution=Resolution(1280, 720), encoder="x264", renderer="cpu")
    limits = QualityLimits.of(stream)
    initial = limits.initial(stream)
    big = limits.clamp(initial, QualityRequest(width=3840, height=2160))
    assert limits.message(initial)["maxKbps"] == default_bitrate(Resolution(1280, 720), 30) // 1000
    assert limits.message(big)["maxKbps"] == default_bitrate(Resolution(3840, 2160), 30) // 1000
    capped = limits.clamp(big, QualityRequest(max_kbps=3000))
    assert limits.message(capped)["maxKbps"] == 3000
    worker = LocalWorker("w", default_scene(), stream, 1, Metrics())
    pictures, encoder = worker.build_stages(Resolution(640, 360), 30.0, None)
    try:
        assert encoder.bitrate == default_bitrate(Resolution(640, 360), 30.0)
    finally:
        encoder.close()
        pictures.close()
    # a bitrate the operator set is a budget per stream, whatever its size
    fixed = QualityLimits.of(StreamConfig(bitrate=4_000_000))
    assert (
        fixed.message(
            fixed.clamp(
                fixed.initial(StreamConfig(bitrate=4_000_000)),
                QualityRequest(width=3840, height=2160),
            )
        )["maxKbps"]
        == 4000
    )
