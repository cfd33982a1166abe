"""Latency in real Chromium on loopback: our pipeline against a bare aiortc + libx264 sender.

For each size (1280x720 at 30 fps, 1920x1080 at 60 fps) it starts `render-server serve` (CPU
renderer, libx264) and, as the baseline in the same run, a bare sender built here: an aiohttp +
aiortc server whose plain video track hands aiortc pre-made `av.VideoFrame`s of a moving
pattern, which aiortc's own H.264 encoder (libx264, its settings, capped at 3 Mbps) encodes. The
bare sender answers pings and sends the same `timing` records, so the same browser-side meter
(client/latency.js) measures both. Headless Chromium drags the mouse over each page and reads
`window.renderStream.latency()`.

    python benchmarks/latency.py [--seconds 10] [--sizes 1280x720@30,1920x1080@60]
        [--client chromium|python]

`--client python` measures our pipeline only, with the Python client (glass-to-glass then ends
at the frame's last packet in, not at display); the bare sender has no signaling for it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fractions
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiortc.rtcrtpsender
import av
import numpy as np
from aiohttp import web
from aiortc import RTCPeerConnection, RTCSessionDescription, VideoStreamTrack

from render_server.tools.local_server import local_server
from render_server.tools.measure.browser import measure_in_chromium
from render_server.tools.measure.client import measure_latency
from render_server.tools.measure.frames import h264_keyframe_nal
from render_server.transport.timing import FrameRecord, FrameTimingLog, now_ms, watch_sent_packets

CLIENT_DIR = Path(__file__).resolve().parent.parent / "render_server" / "client"
PATTERN_FRAMES = 60
TIMING_EVERY_S = 0.1

# -- the bare sender ------------------------------------------------------------------------------

BARE_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>bare aiortc sender</title>
<style>body{margin:0;background:#000}video{width:100vw;height:100vh;display:block}</style>
</head><body data-state="connecting"><video id="v" autoplay muted playsinline></video>
<script type="module">
import { LatencyMeter } from '/latency.js';
const meter = new LatencyMeter();
window.renderStream = { latency: () => meter.summary(), latencyMeter: meter };
const video = document.getElementById('v');
const pc = new RTCPeerConnection();
const transceiver = pc.addTransceiver('video', { direction: 'recvonly' });
const codecs = RTCRtpReceiver.getCapabilities('video').codecs.filter(
  (c) => (c.mimeType === 'video/H264' && /packetization-mode=1/.test(c.sdpFmtpLine || ''))
    || c.mimeType === 'video/rtx');
transceiver.setCodecPreferences(codecs);
if ('jitterBufferTarget' in transceiver.receiver) transceiver.receiver.jitterBufferTarget = 0;
const channel = pc.createDataChannel('input');
pc.ontrack = (e) => { video.srcObject = new MediaStream([e.track]); };
let pings = 0, seq = 0;
channel.onopen = () => {
  const ping = () => {
    channel.send(JSON.stringify({ type: 'ping', id: ++pings, t: performance.now() }));
    setTimeout(ping, pings < 5 ? 100 : 1000);
  };
  ping();
};
channel.onmessage = (e) => {
  const at = performance.now();
  const m = JSON.parse(e.data);
  if (m.type === 'pong') meter.onPong(m, at);
  else if (m.type === 'timing') meter.onTiming(m.frames || []);
};
const move = (e) => {
  if (!(e.buttons & 1) || channel.readyState !== 'open') return;
  seq += 1;
  meter.onInput(seq, e.timeStamp);
  channel.send(JSON.stringify({ type: 'pointer', action: 'move', dx: e.movementX / innerHeight,
    dy: e.movementY / innerHeight, buttons: e.buttons, seq }));
};
const raw = 'onpointerrawupdate' in window;
document.addEventListener(raw ? 'pointerrawupdate' : 'pointermove', move);
const shown = (now, meta) => {
  document.body.dataset.state = 'streaming';
  meter.onFrameShown(now, meta);
  video.requestVideoFrameCallback(shown);
};
video.requestVideoFrameCallback(shown);
await pc.setLocalDescription(await pc.createOffer());
await new Promise((ok) => {
  if (pc.iceGatheringState === 'complete') ok();
  pc.onicegatheringstatechange = () => pc.iceGatheringState === 'complete' && ok();
});
const answer = await (await fetch('/offer', { method: 'POST',
  body: JSON.stringify({ sdp: pc.localDescription.sdp, type: 'offer' }) })).json();
await pc.setRemoteDescription(answer);
</script></body></html>
"""


class _Steering:
    """The newest input a bare session got: what its next frame shows."""

    def __init__(self) -> None:
        self.seq, self.input_ms, self.shown_seq, self.pan = -1, 0.0, -1, 0.0

    def take(self) -> tuple[int, float | None]:
        if self.seq > self.shown_seq:
            self.shown_seq = self.seq
            return self.seq, self.input_ms
        return -1, None


class PatternTrack(VideoStreamTrack):
    """Pre-made frames of a moving pattern at `fps`, shifted by the drag; notes when each
    frame left `recv()` (the frame's start) and what input it shows."""

    def __init__(self, frames: list[av.VideoFrame], fps: float, steering: _Steering) -> None:
        super().__init__()
        self.frames, self.fps, self.steering = frames, fps, steering
        self.started: dict[int, tuple[float, int, float | None]] = {}  # pts → r0, seq, input
        self._t0: float | None = None
        self._n = 0

    async def recv(self) -> av.VideoFrame:
        if self._t0 is None:
            self._t0 = time.monotonic()
        due = self._t0 + self._n / self.fps
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        pts = round(self._n * 90_000 / self.fps)
        self._n += 1
        seq, input_ms = self.steering.take()
        index = (self._n + int(self.steering.pan * 30)) % len(self.frames)
        frame = self.frames[index]
        frame.pts, frame.time_base = pts, fractions.Fraction(1, 90_000)
        self.started[pts] = (now_ms(), seq, input_ms)
        return frame


class TimedEncoder:
    """aiortc's encoder, with the end of each encode noted by the frame's 90 kHz timestamp."""

    ended: dict[int, float] = {}

    def __init__(self, inner: Any) -> None:
        object.__setattr__(self, "_inner", inner)

    def encode(self, frame: Any, force_keyframe: bool = False) -> tuple[list[bytes], int]:
        payloads, timestamp = self._inner.encode(frame, force_keyframe)
        TimedEncoder.ended[timestamp] = now_ms()
        return payloads, timestamp

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._inner, name, value)  # target_bitrate from REMB


def _install_timed_encoder() -> None:
    original = aiortc.rtcrtpsender.get_encoder
    if getattr(original, "timed", False):
        return

    def get_encoder(codec: Any) -> Any:
        return TimedEncoder(original(codec))

    get_encoder.timed = True  # type: ignore[attr-defined]
    aiortc.rtcrtpsender.get_encoder = get_encoder  # type: ignore[attr-defined]


def pattern_frames(width: int, height: int, count: int = PATTERN_FRAMES) -> list[av.VideoFrame]:
    """A diagonal colour ramp with a moving bar: changes every frame, like a moving camera."""
    y, x = np.mgrid[0:height, 0:width]
    frames = []
    for i in range(count):
        shift = i * width // count
        rgb = np.empty((height, width, 3), np.uint8)
        rgb[..., 0] = ((x + shift) * 255 // width) % 256
        rgb[..., 1] = (y * 255 // height) % 256
        rgb[..., 2] = ((x + y + 2 * shift) // 4) % 256
        rgb[:, (shift + np.arange(width // 20)) % width] = 255
        frames.append(av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format="yuv420p"))
    return frames


async def _bare_session(request: web.Request) -> web.Response:
    app = request.app
    offer = await request.json()
    pc = RTCPeerConnection()
    app["pcs"].add(pc)
    steering = _Steering()
    track = PatternTrack(app["frames"], app["fps"], steering)
    log = FrameTimingLog()

    @pc.on("datachannel")
    def on_channel(channel: Any) -> None:
        @channel.on("message")
        def on_message(data: str) -> None:
            arrived = now_ms()
            message = json.loads(data)
            if message.get("type") == "ping":
                channel.send(json.dumps({**message, "type": "pong", "w": arrived}))
            elif message.get("type") == "pointer" and isinstance(message.get("seq"), int):
                steering.seq, steering.input_ms = message["seq"], arrived
                steering.pan += float(message.get("dx", 0.0))

        async def send_timing() -> None:
            while channel.readyState != "closed":
                await asyncio.sleep(TIMING_EVERY_S)
                rows = [record.row() for record in log.drain()]
                if rows and channel.readyState == "open":
                    channel.send(json.dumps({"type": "timing", "frames": rows}))

        app["tasks"].add(asyncio.ensure_future(send_timing()))

    await pc.setRemoteDescription(RTCSessionDescription(offer["sdp"], offer["type"]))
    sender = pc.addTrack(track)
    next_encoded = sender._next_encoded_frame

    async def timed_next(codec: Any) -> Any:
        encoded = await next_encoded(codec)
        if encoded is not None:
            r0, seq, input_ms = track.started.pop(encoded.timestamp, (now_ms(), -1, None))
            e1 = TimedEncoder.ended.pop(encoded.timestamp, now_ms())
            keyframe = any(h264_keyframe_nal(p) for p in encoded.payloads)
            log.handed(
                FrameRecord(encoded.timestamp, seq, input_ms, r0, r0, e1, e1,
                            sum(len(p) for p in encoded.payloads), keyframe)
            )  # fmt: skip
        return encoded

    sender._next_encoded_frame = timed_next  # type: ignore[method-assign]
    await pc.setLocalDescription(await pc.createAnswer())
    watch_sent_packets(sender, log.packet_sent)
    return web.json_response({"sdp": pc.localDescription.sdp, "type": "answer"})


@contextlib.contextmanager
def bare_sender(width: int, height: int, fps: float) -> Iterator[str]:
    """The bare aiortc server on a free port, in a thread of its own; yields its URL."""
    _install_timed_encoder()
    loop = asyncio.new_event_loop()
    app = web.Application()
    app["frames"], app["fps"], app["pcs"], app["tasks"] = (
        pattern_frames(width, height), fps, set(), set()
    )  # fmt: skip
    app.router.add_get("/", lambda _: web.Response(text=BARE_PAGE, content_type="text/html"))
    script = {"Content-Type": "text/javascript"}
    app.router.add_get(
        "/latency.js", lambda _: web.FileResponse(CLIENT_DIR / "latency.js", headers=script)
    )
    app.router.add_post("/offer", _bare_session)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def shutdown() -> None:
        for task in app["tasks"]:
            task.cancel()
        await asyncio.gather(*(pc.close() for pc in app["pcs"]), return_exceptions=True)
        await runner.cleanup()

    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(shutdown(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


# -- our pipeline ---------------------------------------------------------------------------------


@contextlib.contextmanager
def our_server(width: int, height: int, fps: float, log_dir: Path) -> Iterator[str]:
    """`render-server serve` with the CPU renderer and libx264, as a user runs it."""
    size = f"{width}x{height}"
    with local_server(
        "--resolution", size, "--fps", str(fps), "--renderer", "cpu", "--encoder", "x264",
        "--max-resolution", size, log_path=log_dir / f"serve-{size}.log",
    ) as server:  # fmt: skip
        yield server.url


# -- measuring ------------------------------------------------------------------------------------


def measure(url: str, client: str, seconds: float, viewport: tuple[int, int]) -> dict[str, Any]:
    if client == "chromium":
        return measure_in_chromium(url, seconds, viewport=viewport)
    return asyncio.run(measure_latency(url, seconds, decode="none"))


def figures(report: dict[str, Any]) -> dict[str, float | None]:
    g2g = report.get("glassToGlass") or report.get("glass_to_glass") or {}
    i2p = report.get("inputToPhoton") or report.get("input_to_frame") or {}
    stages = {k: (v or {}).get("p50") for k, v in report["stages"].items()}
    return {
        "frames": report["frames"],
        "i2p_p50": i2p.get("p50"),
        "g2g_p50": g2g.get("p50"),
        "g2g_p95": g2g.get("p95"),
        **{f"{k}_p50": v for k, v in stages.items()},
    }


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--sizes", default="1280x720@30,1920x1080@60")
    parser.add_argument("--client", choices=("chromium", "python"), default="chromium")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    results = []
    log_dir = Path(tempfile.mkdtemp(prefix="latency-bench-"))
    for size in args.sizes.split(","):
        dims, fps_text = size.split("@")
        width, height = (int(v) for v in dims.split("x"))
        fps = float(fps_text)
        viewport = (min(width, 1280), min(height, 720))
        with our_server(width, height, fps, log_dir) as url:
            ours = figures(measure(url, args.client, args.seconds, viewport))
        bare: dict[str, Any] = {k: None for k in ours}
        if args.client == "chromium":  # the bare sender speaks no signaling protocol
            with bare_sender(width, height, fps) as url:
                bare = figures(measure(url, args.client, args.seconds, viewport))
        results.append({"size": size, "ours": ours, "bare": bare})
        print(f"measured {size}", file=sys.stderr, flush=True)

    if args.json:
        print(json.dumps({"client": args.client, "results": results}, indent=2))
        return 0
    totals = ("i2p_p50", "g2g_p50")
    stage_names = [k for k in results[0]["ours"] if k.endswith("_p50") and k not in totals]
    print(f"latency on loopback, {args.client} client, {args.seconds:g} s per run, "
          f"{os.cpu_count()} CPUs; ms")  # fmt: skip
    head = f"{'size':<15}{'sender':<8}{'frames':>7}{'i2p p50':>9}{'g2g p50':>9}{'g2g p95':>9}"
    head += "".join(f"{name[:-4][:8]:>9}" for name in stage_names)
    print(head)
    for result in results:
        for who in ("ours", "bare"):
            f = result[who]
            frames = "-" if f["frames"] is None else str(f["frames"])
            line = f"{result['size']:<15}{who:<8}{frames:>7}{_ms(f['i2p_p50']):>9}"
            line += f"{_ms(f['g2g_p50']):>9}{_ms(f['g2g_p95']):>9}"
            line += "".join(f"{_ms(f[name]):>9}" for name in stage_names)
            print(line)
        ours, bare = result["ours"], result["bare"]
        if ours["g2g_p50"] and bare["g2g_p50"]:
            print(f"{'':<15}glass-to-glass p50, ours / bare aiortc+libx264: "
                  f"{ours['g2g_p50'] / bare['g2g_p50']:.2f}×")  # fmt: skip
    print("bare = aiortc's own H.264 encoder (libx264, its settings, ≤ 3 Mbps) fed pre-made "
          "frames: its 'render' is 0 and its 'encode' includes the wait for aiortc's encoder "
          "thread.")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
