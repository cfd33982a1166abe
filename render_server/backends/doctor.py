"""`render-server doctor`: what this machine offers the render server, and how fast it runs."""

from __future__ import annotations

import os
import platform
import sys
from typing import Any

import av
import numpy as np

from render_server import __version__
from render_server.backends.bench import bench_encoder, bench_renderer
from render_server.backends.choice import Backends, choose_backends, device_frames_supported
from render_server.backends.gpu import describe, probe_cuda, probe_nvenc
from render_server.config import Resolution
from render_server.encode.nvenc import NVENC_CODECS
from render_server.encode.x264 import create_x264_encoder
from render_server.render.builtin_scenes import default_scene

BENCH_RESOLUTION = Resolution(1280, 720)


def probe_x264() -> dict[str, Any]:
    try:
        encoder = create_x264_encoder(Resolution(256, 256), 30.0, 1_000_000)
        frame = av.VideoFrame.from_ndarray(np.zeros((256, 256, 3), np.uint8), format="rgb24")
        packet = encoder.encode(frame.reformat(format="yuv420p"), pts=0, keyframe=True)
    except Exception as exc:
        return {"available": False, "reason": str(exc)}
    ok = packet is not None
    return {"available": ok, "reason": "ok" if ok else "libx264 produced no packet"}


def probe_device_frames(auto: Backends) -> dict[str, Any]:
    """Whether NVENC takes the CUDA renderer's frames in GPU memory: tried for real, by
    opening an encoder on one and encoding a frame, where both are there."""
    unsupported = device_frames_supported()
    if unsupported is not None:
        return {"available": False, "reason": unsupported}
    if auto.renderer != "cuda" or auto.encoder != "nvenc":
        missing = "no CUDA renderer" if auto.renderer != "cuda" else "no NVENC"
        return {"available": False, "reason": f"{missing}: frames go through host memory"}
    from render_server.render.camera import OrbitCamera
    from render_server.render.cuda.renderer import CudaRenderer
    from render_server.stream.pictures import CudaPictures, nvenc_on_device

    scene = default_scene()
    try:
        pictures = CudaPictures(CudaRenderer(scene, 256, 256), "cuda")
        encoder = nvenc_on_device(pictures, 30.0, 1_000_000)
        try:
            camera = OrbitCamera.framed_on(scene.bounds_min, scene.bounds_max)
            packet = encoder.encode(pictures.picture(camera), pts=0)
        finally:
            encoder.close()
            pictures.close()
    except Exception as exc:
        return {"available": False, "reason": f"NVENC did not take a CUDA frame: {exc}"}
    if packet is None or not packet.is_keyframe:
        return {"available": False, "reason": "NVENC gave no IDR for a CUDA frame"}
    return {"available": True, "reason": "NVENC encoded a frame read in GPU memory"}


def diagnose(seconds: float = 3.0) -> dict[str, Any]:
    """Everything doctor reports, as one JSON-ready document."""
    cuda = probe_cuda()
    nvenc = {codec: probe_nvenc(codec, cuda.devices) for codec in NVENC_CODECS}
    x264 = probe_x264()
    auto = choose_backends("auto", "auto", cuda, nvenc["h264"])
    report: dict[str, Any] = {
        "render_server": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_cores": os.cpu_count(),
        "pyav": av.__version__,
        "cuda": describe(cuda),
        "nvenc": {codec: describe(status) for codec, status in nvenc.items()},
        "libx264": x264,
        "auto": {
            "renderer": auto.renderer,
            "renderer_reason": auto.renderer_reason,
            "encoder": auto.encoder,
            "encoder_reason": auto.encoder_reason,
        },
        "device_frames": probe_device_frames(auto),
        "codecs": auto.codec_encoders,
        "benchmarks": [],
    }
    for status in report["nvenc"].values():
        status.pop("log", None)  # FFmpeg's raw lines: useful when debugging, noise here
    if seconds > 0:
        scene = default_scene()
        renderers = ["cpu"] + (["cuda"] if cuda.available else [])
        encoders = (["x264"] if x264["available"] else []) + (
            ["nvenc"] if nvenc["h264"].available else []
        )
        for name in renderers:
            report["benchmarks"].append(_measure(bench_renderer, scene, name, seconds))
        for name in encoders:
            report["benchmarks"].append(_measure(bench_encoder, scene, name, seconds))
    return report


def _measure(bench: Any, scene: Any, name: str, seconds: float) -> dict[str, Any]:
    try:
        result: dict[str, Any] = bench(scene, name, BENCH_RESOLUTION, seconds).as_dict()
        return result
    except Exception as exc:  # a backend that probes well can still fail to run: say so
        return {"what": name, "error": str(exc)}


def format_report(report: dict[str, Any]) -> str:
    cuda = report["cuda"]
    lines = [
        f"render-server {report['render_server']} · Python {report['python']} · "
        f"PyAV {report['pyav']} · {report['cpu_cores']} CPU cores · {report['platform']}",
        "",
        f"CUDA:     {'yes' if cuda['available'] else 'no'} ({cuda['reason']})",
    ]
    if cuda["nvidia_driver"] or cuda["cuda_driver_api"]:
        lines.append(
            f"          driver {cuda['nvidia_driver'] or '?'}, CUDA API {cuda['cuda_driver_api']}"
        )
    for device in cuda["devices"]:
        nvenc = "has NVENC" if device["has_nvenc"] else "NO NVENC engine"
        lines.append(
            f"          GPU {device['index']}: {device['name']} "
            f"(sm {device['compute_capability']}, {device['memory_mib']} MiB, {nvenc})"
        )
    for codec, status in report["nvenc"].items():
        state = "yes" if status["available"] else "no"
        lines.append(f"NVENC {codec:<4} {state} ({status['reason']})")
    x264 = report["libx264"]
    lines.append(f"libx264:  {'yes' if x264['available'] else 'no'} ({x264['reason']})")
    auto = report["auto"]
    lines += [
        "",
        f"auto renderer: {auto['renderer']} ({auto['renderer_reason']})",
        f"auto encoder:  {auto['encoder']} ({auto['encoder_reason']})",
    ]
    device = report["device_frames"]
    frames = "in GPU memory" if device["available"] else "through host memory"
    lines.append(f"NVENC input:   {frames} ({device['reason']})")
    codecs = ", ".join(f"{codec} ({encoder})" for codec, encoder in report["codecs"].items())
    lines.append(f"codecs sent:   {codecs or 'none'} (each session: the first its browser offers)")
    if report["benchmarks"]:
        lines += ["", f"benchmarks at {BENCH_RESOLUTION} (median ms per frame, moving camera):"]
        for b in report["benchmarks"]:
            if "error" in b:
                lines.append(f"  {b['what']:<28} failed: {b['error']}")
                continue
            stages = ", ".join(f"{k} {v:.2f}" for k, v in b["stages_ms"].items())
            lines.append(f"  {b['what']:<28} {stages}  ({b['fps']:.0f} fps over {b['frames']})")
    return "\n".join(lines)
