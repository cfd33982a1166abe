import av
import numpy as np
import pytest

from render_server.config import Resolution, default_bitrate
from render_server.encode import YuvConverter, create_x264_encoder, rgb_to_yuv420
from render_server.encode.h264_bitstream import NAL_IDR, is_self_contained_idr, nal_unit_types
from render_server.stream.keyframes import KeyframeGate

RES = Resolution(1280, 720)
FPS = 30.0


def synthetic_frame(shift: int = 0) -> np.ndarray:
    """Smooth shading, hard edges and a little texture: what a rendered scene looks like."""
    yy, xx = np.mgrid[0 : RES.height, 0 : RES.width].astype(np.float32)
    rgb = np.empty((RES.height, RES.width, 3), np.float32)
    rgb[..., 0] = 60 + 120 * (xx / RES.width)
    rgb[..., 1] = 80 + 100 * (yy / RES.height)
    rgb[..., 2] = 140 + 40 * np.sin((xx + yy) / 90.0)
    disc = (xx - 640 - shift) ** 2 + (yy - 360) ** 2 < 150**2
    rgb[disc] = (200, 40, 30)
    box = (np.abs(xx - 300 + shift) < 90) & (np.abs(yy - 500) < 120)
    rgb[box] = (30, 60, 190) + 20 * ((xx[box] // 16 + yy[box] // 16) % 2)[:, None]
    return np.clip(rgb, 0, 255).astype(np.uint8)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float(10 * np.log10(255.0**2 / mse))


def decode_rgb(decoder: av.CodecContext, packet: av.Packet) -> list[np.ndarray]:
    frames = decoder.decode(av.Packet(bytes(packet)))
    return [f.reformat(format="rgb24", src_colorspace="itu709").to_ndarray() for f in frames]


@pytest.fixture
def encoder():  # type: ignore[no-untyped-def]
    enc = create_x264_encoder(RES, FPS, default_bitrate(RES, FPS))
    yield enc
    enc.close()


def test_packets_decode_back_close_to_the_input(encoder) -> None:  # type: ignore[no-untyped-def]
    decoder = av.CodecContext.create("h264", "r")
    scores = []
    for i in range(10):
        rgb = synthetic_frame(shift=4 * i)
        packet = encoder.encode(rgb_to_yuv420(rgb), pts=i * 3000)
        assert packet is not None, "zerolatency x264 must emit one access unit per frame"
        assert packet.pts == i * 3000 and packet.time_base.denominator == 90000
        (decoded,) = decode_rgb(decoder, packet)
        assert decoded.shape == rgb.shape
        scores.append(psnr(decoded, rgb))
    assert min(scores) >= 35.0, scores


def test_first_frame_and_requested_keyframes_are_self_contained_idrs(encoder) -> None:  # type: ignore[no-untyped-def]
    packets = []
    for i in range(8):
        frame = rgb_to_yuv420(synthetic_frame(shift=3 * i))
        packets.append(encoder.encode(frame, pts=i * 3000, keyframe=(i in (0, 5))))
    kinds = [NAL_IDR in nal_unit_types(bytes(p)) for p in packets]
    assert kinds == [True, False, False, False, False, True, False, False]
    assert packets[5].is_keyframe and is_self_contained_idr(bytes(packets[5]))
    # a decoder that joins at the requested keyframe gets a picture at once
    late_joiner = av.CodecContext.create("h264", "r")
    frames = decode_rgb(late_joiner, packets[5])
    assert len(frames) == 1
    assert psnr(frames[0], synthetic_frame(shift=15)) >= 35.0


def test_no_keyframes_unless_asked(encoder) -> None:  # type: ignore[no-untyped-def]
    # infinite GOP, no scene-cut keyframes: a hard cut must not cost an IDR nobody asked for
    frames = [synthetic_frame(), 255 - synthetic_frame(), synthetic_frame()]
    packets = [encoder.encode(rgb_to_yuv420(f), pts=i * 3000) for i, f in enumerate(frames * 20)]
    assert sum(p.is_keyframe for p in packets) == 1


def test_keyframe_gate_rate_limits_without_losing_requests() -> None:
    gate = KeyframeGate(min_interval_s=0.25)
    assert gate.take(now=10.0)  # the first frame
    assert not gate.take(now=10.01)
    for _ in range(100):  # a storm of PLIs
        gate.request()
    assert not gate.take(now=10.1)  # inside the interval: held back ...
    assert gate.take(now=10.26)  # ... not lost
    assert not gate.take(now=10.6)  # one IDR for the whole storm
    assert gate.requests == 100


def test_encoder_refuses_frames_of_another_size(encoder) -> None:  # type: ignore[no-untyped-def]
    small = rgb_to_yuv420(np.zeros((360, 640, 3), np.uint8))
    with pytest.raises(ValueError, match="640x360"):
        encoder.encode(small, pts=0)


def test_colour_conversion_matches_swscale_bt709() -> None:
    rgb = synthetic_frame(shift=7)
    ours = rgb_to_yuv420(rgb)
    reference = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(
        format="yuv420p", dst_colorspace="itu709"
    )
    for index in range(3):
        a = np.frombuffer(ours.planes[index], np.uint8).astype(np.int16)
        b = np.frombuffer(reference.planes[index], np.uint8).astype(np.int16)
        # chroma differs only where swscale's subsampling filter and our 2×2 mean disagree: edges
        assert np.abs(a - b).mean() < 1.0, index
    back = ours.reformat(format="rgb24", src_colorspace="itu709").to_ndarray()
    assert psnr(back, rgb) > 35.0


def test_a_reused_conversion_frame_encodes_each_picture(encoder) -> None:  # type: ignore[no-untyped-def]
    # the pipeline converts every picture into the same frame: the encoder must have copied
    # the previous one before it is overwritten
    converter = YuvConverter(RES.width, RES.height)
    decoder = av.CodecContext.create("h264", "r")
    for i in range(6):
        rgb = synthetic_frame(shift=25 * i)
        frame = converter.convert(rgb)
        assert frame is converter.frame
        packet = encoder.encode(frame, pts=i * 3000)
        (decoded,) = decode_rgb(decoder, packet)
        assert psnr(decoded, rgb) >= 35.0, i
    with pytest.raises(ValueError, match="converter is 1280x720"):
        converter.convert(np.zeros((360, 640, 3), np.uint8))


def noise_frames(count: int) -> list[av.VideoFrame]:
    rng = np.random.default_rng(7)
    base = (rng.random((RES.height, RES.width, 3)) * 255).astype(np.uint8)
    return [rgb_to_yuv420(np.roll(base, 8 * i, axis=1)) for i in range(count)]


def test_the_rate_buffer_bounds_every_frame() -> None:
    # noise is the worst case: without a working VBV the first IDR of this is ~350 KB
    bitrate = 2_000_000
    encoder = create_x264_encoder(RES, FPS, bitrate)
    sizes = [encoder.encode(f, pts=i * 3000).size for i, f in enumerate(noise_frames(20))]
    bufsize_bytes = bitrate * 3 / FPS / 8
    assert max(sizes) <= 1.3 * bufsize_bytes, (max(sizes), bufsize_bytes)


def test_set_bitrate_takes_effect_and_is_capped() -> None:
    encoder = create_x264_encoder(RES, FPS, 2_000_000)
    frames = noise_frames(60)
    sizes = [encoder.encode(f, pts=i * 3000).size for i, f in enumerate(frames[:30])]
    assert encoder.set_bitrate(500_000) == 500_000
    sizes += [encoder.encode(f, pts=(30 + i) * 3000).size for i, f in enumerate(frames[30:])]
    before = sum(sizes[10:30]) / 20
    after = sum(sizes[40:]) / 20  # x264's ABR settles over a few frames
    assert after < 0.5 * before, (before, after)
    assert after * 8 * FPS < 1.5 * 500_000
    assert encoder.set_bitrate(10**9) == 2_000_000  # never above what the operator configured
    assert encoder.set_bitrate(1) == 100_000  # nor below a floor that still shows a picture


@pytest.mark.parametrize("bands", [2, 3, 5])
def test_conversion_in_bands_of_rows_gives_the_same_planes(bands: int) -> None:
    rgb = np.random.default_rng(7).integers(0, 256, (150, 98, 3), dtype=np.uint8)
    one = YuvConverter(98, 150, bands=1).convert(rgb).to_ndarray()
    split = YuvConverter(98, 150, bands=bands).convert(rgb).to_ndarray()
    assert one.shape == (225, 98)  # Y rows, then U and V
    assert np.array_equal(split, one)
