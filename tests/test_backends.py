"""Backend choice: `auto` falls back with a reason; an explicit GPU backend that cannot run is an
error at start. The GPU pieces are made unavailable for real (pycuda blocked at import, no GPU
visible to CUDA), on any machine, rather than faked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from render_server.backends.choice import BackendUnavailable, choose_backends
from render_server.backends.gpu import (
    CudaStatus,
    GpuDevice,
    NvencStatus,
    explain_nvenc_failure,
    probe_cuda,
    probe_nvenc,
)
from render_server.config import Resolution, StreamConfig
from render_server.metrics import Metrics
from render_server.render import default_scene
from render_server.worker.local import LocalWorker

NO_GPU_ENV = {"CUDA_VISIBLE_DEVICES": ""}  # CUDA then sees no device, whatever the machine


@pytest.fixture
def no_pycuda(tmp_path: Path) -> dict[str, str]:
    """An environment in which `import pycuda` fails, as where it is not installed."""
    shim = tmp_path / "shim" / "pycuda"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('No module named pycuda (blocked)')\n")
    path = os.pathsep.join([str(shim.parent), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, **NO_GPU_ENV, "PYTHONPATH": path}


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "render_server", *args],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip


def test_doctor_json_says_what_auto_picks_and_why(no_pycuda: dict[str, str]) -> None:
    done = cli(no_pycuda, "doctor", "--json", "--seconds", "0.3")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["cuda"]["available"] is False
    assert "pycuda" in report["cuda"]["reason"]
    assert report["auto"]["renderer"] == "cpu" and "pycuda" in report["auto"]["renderer_reason"]
    assert report["auto"]["encoder"] == "x264" and "NVENC" in report["auto"]["encoder_reason"]
    assert set(report["nvenc"]) == {"h264", "hevc", "av1"}
    assert all(not s["available"] and s["reason"] for s in report["nvenc"].values())
    assert report["libx264"]["available"] is True
    assert report["device_frames"]["available"] is False
    assert "no CUDA renderer" in report["device_frames"]["reason"]
    # without NVENC every codec comes from the CPU encoders, in the project's order
    assert report["codecs"] == {"H264": "libx264", "VP8": "libvpx", "AV1": "libsvtav1"}
    measured = {b["what"]: b for b in report["benchmarks"]}
    assert measured["renderer cpu"]["fps"] > 0 and measured["renderer cpu"]["frames"] >= 5
    assert measured["encoder x264 (libx264)"]["stages_ms"]["encode"] > 0


def test_doctor_prints_a_readable_report(no_pycuda: dict[str, str]) -> None:
    done = cli(no_pycuda, "doctor", "--seconds", "0")
    assert done.returncode == 0, done.stderr
    assert "auto renderer: cpu" in done.stdout and "auto encoder:  x264" in done.stdout
    assert "NVENC h264 no" in done.stdout
    assert "codecs sent:   H264 (libx264), VP8 (libvpx), AV1 (libsvtav1)" in done.stdout


def test_explicit_gpu_backends_that_cannot_run_stop_the_server(no_pycuda: dict[str, str]) -> None:
    cuda = cli(no_pycuda, "serve", "--renderer", "cuda", "--port", "0")
    assert cuda.returncode == 2
    assert "--renderer cuda cannot run here" in cuda.stderr and "pycuda" in cuda.stderr
    nvenc = cli(no_pycuda, "serve", "--renderer", "cpu", "--encoder", "nvenc", "--port", "0")
    assert nvenc.returncode == 2
    assert "--encoder nvenc cannot run here" in nvenc.stderr
    assert "Traceback" not in cuda.stderr + nvenc.stderr


def test_probe_cuda_without_pycuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pycuda", None)  # import pycuda raises ImportError
    monkeypatch.setitem(sys.modules, "pycuda.driver", None)
    status = probe_cuda()
    assert not status.available and "pycuda is not installed" in status.reason


def test_nvenc_that_cannot_open_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    status = probe_nvenc("h264")
    assert not status.available
    assert status.reason and status.log  # FFmpeg's own words are kept for debugging


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (["Cannot load libcuda.so.1"], "no CUDA driver"),
        (["Cannot load libnvidia-encode.so.1"], "no NVENC library"),
        (["Driver does not support the required nvenc API version. Required: 13.0"], "too old"),
        (["OpenEncodeSessionEx failed: out of memory (10)"], "session limit"),
        (["No capable devices found"], "no NVENC-capable GPU"),
        (["something new"], "something new"),
    ],
)
def test_nvenc_failures_in_plain_words(lines: list[str], expected: str) -> None:
    assert expected in explain_nvenc_failure(lines)


def test_a_container_without_the_video_capability_is_told_so() -> None:
    lines = ["Cannot load libnvidia-encode.so.1"]
    reason = explain_nvenc_failure(lines, environ={"NVIDIA_DRIVER_CAPABILITIES": "compute,utility"})
    assert "must include video" in reason and "'compute,utility'" in reason
    for granted in ("compute,video,utility", "all"):
        reason = explain_nvenc_failure(lines, environ={"NVIDIA_DRIVER_CAPABILITIES": granted})
        assert "no NVENC library" in reason and "must include" not in reason
    assert "must include" not in explain_nvenc_failure(lines, environ={})  # not in a container


def test_a_gpu_without_nvenc_is_named() -> None:
    h200 = GpuDevice(0, "NVIDIA H200", "9.0", 143_771)
    l4 = GpuDevice(0, "NVIDIA L4", "8.9", 23_034)
    assert not h200.has_nvenc and l4.has_nvenc
    reason = explain_nvenc_failure(["No capable devices found"], (h200,))
    assert "NVIDIA H200 has no NVENC" in reason
    # auto on an H200: CUDA renders, libx264 encodes, and the reason names the GPU
    cuda = CudaStatus(True, "ok", "12.8", "570.86", (h200,))
    chosen = choose_backends("auto", "auto", cuda, NvencStatus("h264", False, reason))
    assert (chosen.renderer, chosen.encoder) == ("cuda", "x264")
    assert "H200 has no NVENC" in chosen.encoder_reason
    assert chosen.pix_fmt == "yuv420p"
    with pytest.raises(BackendUnavailable, match="H200 has no NVENC"):
        choose_backends("auto", "nvenc", cuda, NvencStatus("h264", False, reason))


def test_auto_on_a_machine_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pycuda", None)
    monkeypatch.setitem(sys.modules, "pycuda.driver", None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    chosen = choose_backends("auto", "auto")
    assert (chosen.renderer, chosen.encoder) == ("cpu", "x264")
    assert chosen.gpu is None
    assert choose_backends("cpu", "x264").renderer_reason == "asked for"


def test_a_session_falls_back_to_x264_when_nvenc_will_not_open(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """auto chose NVENC at start, but a later session cannot open one (a consumer GPU's session
    limit, a driver reset): that session encodes with libx264 instead of failing."""
    from render_server.backends.choice import Backends

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # NVENC really cannot open now
    backends = Backends("cpu", "nvenc", "test", "probed earlier", encoder_requested="auto")
    stream = StreamConfig(resolution=Resolution(320, 240))
    worker = LocalWorker("w", default_scene(), stream, 1, Metrics(), (), backends)
    encoder = worker._encoder()
    assert encoder.codec_name == "libx264"
    assert any(r.getMessage() == "encoder.fallback" for r in caplog.records)
    explicit = Backends("cpu", "nvenc", "test", "asked", encoder_requested="nvenc")
    with pytest.raises(OSError):
        LocalWorker("w", default_scene(), stream, 1, Metrics(), (), explicit)._encoder()


@pytest.mark.parametrize("encoder", ["x264", "replay"])
def test_intra_refresh_without_nvenc_is_said_at_start(
    encoder: str, caplog: pytest.LogCaptureFixture
) -> None:
    """`--intra-refresh` is NVENC's: a worker whose encoder is another says so as it starts
    (one configuration may serve a fleet of GPU and CPU workers), and streams with keyframes."""
    from render_server.backends.choice import Backends

    stream = StreamConfig(resolution=Resolution(64, 64), intra_refresh=True)
    backends = Backends("cpu", encoder, "asked for", "asked for")  # type: ignore[arg-type]
    LocalWorker("w", default_scene(), stream, 1, Metrics(), (), backends).warm_up()
    said = [r for r in caplog.records if r.getMessage() == "encoder.intra_refresh_ignored"]
    assert len(said) == 1 and said[0].encoder == encoder  # type: ignore[attr-defined]
    caplog.clear()
    plain = StreamConfig(resolution=Resolution(64, 64))
    LocalWorker("w", default_scene(), plain, 1, Metrics(), (), backends).warm_up()
    assert not any(r.getMessage() == "encoder.intra_refresh_ignored" for r in caplog.records)
