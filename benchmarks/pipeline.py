"""Per-stage cost of the server's frame pipeline, against bare libx264 measured in the same run.

    python benchmarks/pipeline.py [--frames 90] [--resolutions 1280x720,1920x1080]

Stages per frame: picture (the CPU rasterizer and the conversion to YUV 4:2:0 as a session runs
them, `stream.pictures.CpuPictures`: bands of rows taken by the calling thread and the shared
pool, each drawn, shaded and converted by the thread that took it), encode (the
project's libx264 encoder, `encode.x264.create_x264_encoder`), packetize (aiortc's H.264
packetizer + RTP serialization). The camera orbits so every frame is rendered anew. The baseline,
measured in the same run over the same number of frames, is a bare PyAV libx264 context opened
as our encoder opens it (`encode.pyav_encoder.open_codec_context` with `x264_options()`:
ultrafast, zerolatency, Constrained Baseline, keyframes only on request; the same bitrate and
rate buffer) encoding the same YUV frames with nothing else of ours around it; the ratio says
what the whole server-side pipeline costs per frame relative to that bare encode. Times are
p50 / p95 (`tools.stats.median_p95`) over the frames.
"""

from __future__ import annotations

import argparse
import time

import av
from aiortc.codecs.h264 import H264Encoder
from aiortc.rtp import RtpPacket

from render_server.config import Resolution, default_bitrate
from render_server.encode import create_x264_encoder, x264_options
from render_server.encode.pyav_encoder import open_codec_context
from render_server.encode.x264 import VBV_FRAMES
from render_server.render import CpuRenderer, OrbitCamera, default_scene
from render_server.stream.pictures import CpuPictures
from render_server.tools.stats import median_p95


def bare_x264(width: int, height: int, fps: float, bitrate: int) -> av.VideoCodecContext:
    """libx264 as PyAV opens it, with our encoder's settings and nothing else of ours: the
    context `encode.x264.create_x264_encoder` opens (`open_codec_context`), without the
    encoder around it."""
    return open_codec_context(
        "libx264", width, height, fps, bitrate, x264_options(), vbv_frames=VBV_FRAMES
    )


def run(resolution: Resolution, fps: float, frames: int) -> dict[str, tuple[float, float]]:
    scene = default_scene()
    source = CpuPictures(CpuRenderer(scene, resolution.width, resolution.height))
    camera = OrbitCamera.framed_on(scene.bounds_min, scene.bounds_max)
    bitrate = default_bitrate(resolution, fps)
    encoder = create_x264_encoder(resolution, fps, bitrate)
    packetizer = H264Encoder()
    source.picture(camera)  # compile and warm caches outside the measurement

    stages: dict[str, list[float]] = {k: [] for k in ("picture", "encode", "packetize")}
    pictures = []
    for i in range(frames):
        camera.orbit(2 * 3.14159 / frames, 0.0)
        t0 = time.perf_counter()
        yuv = source.picture(camera)
        t2 = time.perf_counter()
        packet = encoder.encode(yuv, pts=i * 3000, keyframe=(i == 0))
        t3 = time.perf_counter()
        assert packet is not None
        payloads, timestamp = packetizer.pack(packet)
        for seq, payload in enumerate(payloads):
            rtp = RtpPacket(payload_type=102, sequence_number=seq & 0xFFFF, timestamp=timestamp)
            rtp.payload = payload
            rtp.serialize()
        t4 = time.perf_counter()
        for key, seconds in zip(stages, (t2 - t0, t3 - t2, t4 - t3), strict=True):
            stages[key].append(seconds * 1e3)
        # a copy: the converter reuses its frame
        pictures.append(av.VideoFrame.from_ndarray(yuv.to_ndarray(), format="yuv420p"))

    baseline_ctx = bare_x264(resolution.width, resolution.height, fps, bitrate)
    baseline = []
    for i, yuv in enumerate(pictures):
        yuv.pts = i * 3000
        t0 = time.perf_counter()
        baseline_ctx.encode(yuv)
        baseline.append((time.perf_counter() - t0) * 1e3)

    result = {k: median_p95(v) for k, v in stages.items()}
    totals = [sum(v[i] for v in stages.values()) for i in range(frames)]
    result["total"] = median_p95(totals)
    result["bare x264"] = median_p95(baseline)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("--frames", type=int, default=90)
    parser.add_argument("--fps", type=float, default=30.0)
    parser.add_argument("--resolutions", default="1280x720,1920x1080")
    args = parser.parse_args()
    print(f"pipeline per frame, ms (p50 / p95), {args.frames} frames each side, fps {args.fps:g}")
    for text in args.resolutions.split(","):
        resolution = Resolution.parse(text)
        result = run(resolution, args.fps, args.frames)
        print(f"\n{resolution}")
        for stage, (median, p95) in result.items():
            print(f"  {stage:<10} {median:7.2f} / {p95:7.2f}")
        ratio = result["total"][0] / result["bare x264"][0]
        budget = 1000.0 / args.fps
        print(f"  whole pipeline / bare libx264 encode: {ratio:.2f}x")
        share = result["total"][0] / budget
        print(f"  whole pipeline / frame interval at {args.fps:g} fps: {share:.2f}")


if __name__ == "__main__":
    main()
