"""Latency in real Chromium on loopback: our pipeline against a bare aiortc sender of the same
libx264 stream.

For each size (1280x720 at 30 fps, 1920x1080 at 60 fps) two senders are measured in the same
run, one after the other, the same way:

- ours: `render-server serve --renderer cpu --encoder x264 --playout-delay low`, as a user
  runs it (`--bitrate` set to the default for the size and rate): signaling, the worker, a
  render on every input, libx264.
- bare (the baseline): a sender built here from aiohttp (one POST trades offer and answer) and
  aiortc alone, in a process of its own as ours is. Its picture is a pre-made pattern (60 YUV
  frames) that the drag steps through and that stands still without input, encoded on the
  session's own thread at each frame time (not ahead of time: an infinite GOP cannot skip
  about) by the encoder our worker uses, `encode.x264.create_x264_encoder` (ultrafast,
  zerolatency, Constrained Baseline, keyframes only on request, the bitrate
  `StreamConfig.bitrate_for` gives the size and rate, REMB followed below it, PLI/FIR through
  the same rate-limited `KeyframeGate`). Each `av.Packet` goes to aiortc through our own track
  (`transport/track.py`'s `EncodedVideoTrack`): paced at the frame rate, missed ticks dropped,
  a still picture repeated (re-encoded) at half the frame rate as ours is, input starting a
  frame at once; and onto the peer connection through our sessions' own video sender
  (`transport/video_sender.py`'s `add_video_sender`): H.264 only, PLI/FIR and REMB routed to
  the encoder, the same playout-delay extension negotiated and requested.
So the two differ in architecture only: no signaling server, no worker, no rendering on input.
Both answer pings and send the same `timing` records, so the same meter (client/latency.js)
measures both. Headless Chromium drags the mouse over each page for `--seconds`; on both sides
only the frames displayed during the drag count: the percentiles are theirs, and the table
gives how many frames each side displayed (and decoded) in that window and their rate.

Then, on each side, `--first-moves` short drags, each after 1.5 s without input (the tools'
FIRST_MOVE_STILL_MS; it was 0.7 s when the README's figures were measured), for the SDK's
pixel meter (client/first-move.js): from the first move's input event to the first displayed
frame whose pixels changed, as a photodiode on the screen would see it (no timing record used).
That is the figure a designer feels when they start to orbit, and the headline one.

The script checks that each side's answer SDP (as Chromium holds it) carries the playout-delay
extension, and prints the x264 options the bare sender's stream carries in its SEI.

    python benchmarks/latency.py [--seconds 10] [--first-moves 30]
        [--sizes 1280x720@30,1920x1080@60] [--client chromium|python] [--json]

`--client python` measures our pipeline only, with the Python client (glass-to-glass then ends
at the frame's last packet in, not at display; frames counted as they arrive); the bare sender
has no signaling for it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import av
import numpy as np
from aiohttp import web
from aiortc import RTCPeerConnection, RTCSessionDescription

from render_server.cli.latency import rows
from render_server.config import Resolution, StreamConfig
from render_server.encode.x264 import create_x264_encoder
from render_server.protocol.timing import now_ms
from render_server.stream.keyframes import KeyframeGate
from render_server.tools.local_server import local_server
from render_server.tools.measure.browser import measure_in_chromium
from render_server.tools.measure.client import LatencyClient
from render_server.transport.playout_delay import PLAYOUT_DELAY_URI
from render_server.transport.timing import FrameRecord, FrameTimingLog, watch_sent_packets
from render_server.transport.track import EncodedVideoTrack
from render_server.transport.video_sender import add_video_sender

CLIENT_DIR = Path(__file__).resolve().parent.parent / "render_server" / "client"
PATTERN_FRAMES = 60
PATTERN_STEPS_PER_HEIGHT = 120  # pattern frames a drag across the page's height steps through
TIMING_EVERY_S = 0.1  # as the worker's sessions send them
PLAYOUT_DELAY = "low"  # `serve`'s default, passed to ours explicitly and requested by the bare one
# x264's own account of its settings, in the SEI of the first IDR; what ultrafast + zerolatency
# set (ultrafast: me=dia subme=0 ref=1 trellis=0; zerolatency: rc_lookahead=0 bframes=0 mbtree=0)
X264_EXPECTED = {"me": "dia", "subme": "0", "ref": "1", "trellis": "0", "rc_lookahead": "0",
                 "bframes": "0", "mbtree": "0", "keyint": "infinite"}  # fmt: skip
X264_SHOWN = (*X264_EXPECTED, "sliced_threads", "threads", "bitrate", "vbv_maxrate", "vbv_bufsize")

# -- the bare sender ------------------------------------------------------------------------------

BARE_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>bare aiortc sender</title>
<style>body{margin:0;background:#000}video{width:100vw;height:100vh;display:block}</style>
</head><body data-state="connecting"><video id="v" autoplay muted playsinline></video>
<script type="module">
import { LatencyMeter } from '/latency.js';
import { FirstMoveMeter } from '/first-move.js';
const meter = new LatencyMeter();
const video = document.getElementById('v');
const firstMoveMeter = new FirstMoveMeter(video);
const pc = new RTCPeerConnection();
window.renderStream = {
  latency: () => ({ ...meter.summary(), firstMove: firstMoveMeter.summary() }),
  latencyMeter: meter, firstMoveMeter, pc,
};
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
  const message = { type: 'pointer', action: 'move', dx: e.movementX / innerHeight,
    dy: e.movementY / innerHeight, buttons: e.buttons, seq };
  channel.send(JSON.stringify(message));
  firstMoveMeter.onSteer(message, e.timeStamp);
};
const raw = 'onpointerrawupdate' in window;
document.addEventListener(raw ? 'pointerrawupdate' : 'pointermove', move);
const shown = (now, meta) => {
  document.body.dataset.state = 'streaming';
  meter.onFrameShown(now, meta);
  firstMoveMeter.onFrameShown(now, meta);
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


def x264_sei_options(access_unit: bytes) -> dict[str, str] | None:
    """The `options:` x264 writes into the SEI of its first IDR, as a dict; None if absent."""
    match = re.search(rb"options: ([ -~]+)", access_unit)
    if match is None:
        return None
    pairs = (item.split("=", 1) for item in match.group(1).decode().split())
    return {key: value for key, *rest in pairs for value in rest[:1]}


@dataclass(frozen=True)
class PatternCamera:
    """What the bare session's next frame shows: a picture of the pattern, and the newest input
    it reflects (-1: none newer than the last frame's)."""

    index: int
    seq: int
    input_ms: float | None


class PatternEncoder:
    """The bare session's frames: pre-made pictures, encoded on the session's one thread by
    our worker's libx264 encoder, with its keyframe gate and its rule for REMB."""

    def __init__(self, frames: list[av.VideoFrame], fps: float, bitrate: int) -> None:
        self.frames = frames
        size = Resolution(frames[0].width, frames[0].height)
        self.encoder = create_x264_encoder(size, fps, bitrate)
        self.keyframes = KeyframeGate(StreamConfig().keyframe_min_interval_s)
        self.x264: dict[str, str] | None = None  # from the first IDR's SEI
        self._estimate: int | None = None
        self._lock = threading.Lock()
        # the last frame: its start and encode end (ms), keyframe or not, what it showed
        self.last = (0.0, 0.0, False, PatternCamera(0, -1, None))

    def request_bitrate(self, bitrate: int) -> None:
        """REMB: aim at `bitrate` from the next frame on (the encoder caps it, as ours)."""
        with self._lock:
            self._estimate = bitrate

    # what `transport.track.EncodedVideoTrack` asks of a frame source (ours: the pipeline)
    cheap = False  # encode on the session's thread, as our pipeline does

    def is_still(self, camera: PatternCamera) -> bool:
        """As our pipeline: the same picture again, with no keyframe due, is a repeat."""
        return camera.index == self.last[3].index and not self.keyframes.pending

    def produce(self, camera: PatternCamera, pts: int) -> av.Packet | None:
        """Picture `camera.index`, encoded; on the session thread. `last` keeps what the
        frame's timing record needs."""
        start = now_ms()
        with self._lock:
            estimate, self._estimate = self._estimate, None
        if estimate is not None:
            self.encoder.set_bitrate(estimate)
        keyframe = self.keyframes.take(time.monotonic())
        packet = self.encoder.encode(self.frames[camera.index], pts, keyframe=keyframe)
        self.last = (start, now_ms(), keyframe, camera)
        if packet is not None and keyframe and self.x264 is None:
            self.x264 = x264_sei_options(bytes(packet))
        return packet


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


@dataclass
class BareSender:
    """The bare sender's state in its process; `report()` is what goes back to the script."""

    answers: list[str] = field(default_factory=list)  # the answer SDP of each session
    encoders: list[PatternEncoder] = field(default_factory=list)

    def report(self) -> dict[str, Any]:
        x264 = next((e.x264 for e in self.encoders if e.x264), None)
        return {"answers": self.answers, "x264": x264}


async def _bare_session(request: web.Request) -> web.Response:
    app = request.app
    bare: BareSender = app["bare"]
    offer = await request.json()
    pc = RTCPeerConnection()
    app["pcs"].add(pc)
    steering, log = _Steering(), FrameTimingLog()
    source = PatternEncoder(app["frames"], app["fps"], app["bitrate"])
    executor = ThreadPoolExecutor(1, thread_name_prefix="bare-session")
    app["executors"].append(executor)

    def camera_for_frame(dt: float) -> PatternCamera:
        seq, input_ms = steering.take()
        index = round(steering.pan * PATTERN_STEPS_PER_HEIGHT) % len(source.frames)
        return PatternCamera(index, seq, input_ms)

    def handed(packet: av.Packet, handed_ms: float) -> None:
        start, encoded, keyframe, shot = source.last
        record = FrameRecord(
            pts=int(packet.pts or 0), seq=shot.seq, input_ms=shot.input_ms, start_ms=start,
            rendered_ms=start, encoded_ms=encoded, handed_ms=handed_ms, bytes=packet.size,
            keyframe=keyframe,
        )  # fmt: skip
        log.handed(record)

    # our own track: the same pacing, tick dropping, poke and idle repeats as a session of
    # ours (`serve`'s default idle rate: half the frame rate)
    track = EncodedVideoTrack(source, app["fps"], camera_for_frame, executor, handed)
    bare.encoders.append(source)

    @pc.on("datachannel")
    def on_channel(channel: Any) -> None:
        @channel.on("message")
        def on_message(data: str) -> None:
            arrived = now_ms()
            message = json.loads(data)
            if message.get("type") == "ping":
                channel.send(json.dumps({**message, "type": "pong", "w": round(arrived, 3)}))
            elif message.get("type") == "pointer" and isinstance(message.get("seq"), int):
                steering.seq, steering.input_ms = message["seq"], arrived
                steering.pan += float(message.get("dx", 0.0))
                track.poke()

        async def send_timing() -> None:
            while channel.readyState != "closed":
                await asyncio.sleep(TIMING_EVERY_S)
                rows = [record.row() for record in log.drain()]
                if rows and channel.readyState == "open":
                    channel.send(json.dumps({"type": "timing", "frames": rows}))

        app["tasks"].add(asyncio.ensure_future(send_timing()))

    # our session's own video sender, in the order of its accept_offer
    transceiver = add_video_sender(
        pc, track, PLAYOUT_DELAY, source.keyframes.request, source.request_bitrate
    )
    await pc.setRemoteDescription(RTCSessionDescription(offer["sdp"], offer["type"]))
    watch_sent_packets(transceiver.sender, log.packet_sent)
    await pc.setLocalDescription(await pc.createAnswer())
    answer = pc.localDescription.sdp
    bare.answers.append(answer)
    return web.json_response({"sdp": answer, "type": "answer"})


def _bare_process(conn: Any, width: int, height: int, fps: float) -> None:
    """The bare aiortc server, in a process of its own (as ours is): sends its port on `conn`,
    serves until `conn` says "stop", then sends `BareSender.report()`. (The playout-delay
    extension is registered by importing `transport.video_sender`, as in our processes.)"""
    bare = BareSender()
    app = web.Application()
    bitrate = StreamConfig().bitrate_for(Resolution(width, height), fps)
    app["bare"], app["frames"], app["fps"], app["bitrate"] = (
        bare, pattern_frames(width, height), fps, bitrate
    )  # fmt: skip
    app["pcs"], app["tasks"], app["executors"] = set(), set(), []
    app.router.add_get("/", lambda _: web.Response(text=BARE_PAGE, content_type="text/html"))
    script = {"Content-Type": "text/javascript"}
    app.router.add_get(
        "/latency.js", lambda _: web.FileResponse(CLIENT_DIR / "latency.js", headers=script)
    )
    app.router.add_get(
        "/first-move.js",
        lambda _: web.FileResponse(CLIENT_DIR / "first-move.js", headers=script),
    )
    app.router.add_post("/offer", _bare_session)

    async def serve() -> None:
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        conn.send(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        while await asyncio.get_running_loop().run_in_executor(None, conn.recv) != "stop":
            pass
        for task in app["tasks"]:
            task.cancel()
        await asyncio.gather(*(pc.close() for pc in app["pcs"]), return_exceptions=True)
        await runner.cleanup()

    asyncio.run(serve())
    for executor in app["executors"]:
        executor.shutdown(wait=True)
    conn.send(bare.report())


@contextlib.contextmanager
def bare_sender(width: int, height: int, fps: float) -> Iterator[tuple[str, dict[str, Any]]]:
    """The bare aiortc server on a free port, in a process of its own; yields its URL and a
    dict that holds its report (`BareSender.report()`) once the block is left."""
    context = mp.get_context("spawn")
    ours, theirs = context.Pipe()
    process = context.Process(target=_bare_process, args=(theirs, width, height, fps))
    process.start()
    report: dict[str, Any] = {}
    try:
        if not ours.poll(120):
            raise RuntimeError("the bare sender did not start within 120 s")
        yield f"http://127.0.0.1:{ours.recv()}", report
        ours.send("stop")
        if not ours.poll(30):
            raise RuntimeError("the bare sender did not stop within 30 s")
        report.update(ours.recv())
    finally:
        process.join(10)
        if process.is_alive():
            process.kill()


# -- our pipeline ---------------------------------------------------------------------------------


@contextlib.contextmanager
def our_server(width: int, height: int, fps: float, log_dir: Path) -> Iterator[str]:
    """`render-server serve` with the CPU renderer and libx264, as a user runs it (the bitrate
    and playout delay given explicitly, so that no environment variable sets others)."""
    size = f"{width}x{height}"
    bitrate = StreamConfig().bitrate_for(Resolution(width, height), fps)
    with local_server(
        "--resolution", size, "--fps", str(fps), "--renderer", "cpu", "--encoder", "x264",
        "--max-resolution", size, "--playout-delay", PLAYOUT_DELAY, "--bitrate", str(bitrate),
        log_path=log_dir / f"serve-{size}.log",
    ) as server:  # fmt: skip
        yield server.url


# -- measuring ------------------------------------------------------------------------------------

# Both pages keep a `LatencyMeter` at `window.renderStream.latencyMeter` and their peer
# connection at `.pc`. At the drag's start the meter forgets its kept frames, keeps every frame
# from then on (not only the last 600) and notes when each was displayed; the summary is then
# taken over the frames displayed during the drag only.
_DECODED_JS = """async (pc) => {
  let n = 0;
  (await pc.getStats()).forEach((s) => {
    if (s.type === 'inbound-rtp' && s.kind === 'video') n += s.framesDecoded || 0;
  });
  return n;
}"""
OPEN_WINDOW_JS = f"""async () => {{
  const rs = window.renderStream, m = rs.latencyMeter, decoded = {_DECODED_JS};
  const breakdown = m._breakdown.bind(m);
  m._breakdown = (shown, row, offset) =>
    Object.assign(breakdown(shown, row, offset), {{ shownAt: shown.at }});
  m._push = (frame) => {{ m.frames.push(frame); }};
  const decoded0 = await decoded(rs.pc);
  m.frames = [];
  window.__window = {{ t0: performance.now(), shown0: m.displayed, decoded0 }};
}}"""
CLOSE_WINDOW_JS = f"""async () => {{
  const rs = window.renderStream, w = window.__window, decoded = {_DECODED_JS};
  w.t1 = performance.now();
  w.shown1 = rs.latencyMeter.displayed;
  w.decoded1 = await decoded(rs.pc);
}}"""
SUMMARY_JS = """() => {
  const rs = window.renderStream, m = rs.latencyMeter, w = window.__window;
  // each first move's frame (the first with a record showing its input or a later one): where
  // its time went, stage by stage
  const moveFrames = rs.firstMoveMeter.moves.map((move) => m.frames.find(
    (f) => f.seq >= move.seq && f.shownAt >= move.at)).filter((f) => f);
  m.frames = m.frames.filter((f) => f.shownAt >= w.t0 && f.shownAt <= w.t1);
  const summary = m.summary();
  summary.firstMove = rs.firstMoveMeter.summary();
  summary.firstMove.stages = {};
  const median = (values) => {
    const sorted = values.filter((v) => Number.isFinite(v)).sort((a, b) => a - b);
    return sorted.length ? sorted[Math.floor((sorted.length - 1) / 2)] : null;
  };
  for (const stage of Object.keys(summary.stages)) {
    summary.firstMove.stages[stage] = median(moveFrames.map((f) => f.stages[stage]));
  }
  summary.firstMove.frames = moveFrames.length;
  summary.window = { seconds: (w.t1 - w.t0) / 1000, shown: w.shown1 - w.shown0,
    decoded: w.decoded1 - w.decoded0 };
  summary.answerSdp = rs.pc && rs.pc.remoteDescription ? rs.pc.remoteDescription.sdp : null;
  return summary;
}"""


async def measure_in_python(url: str, seconds: float) -> dict[str, Any]:
    """Our pipeline with the Python client; frames counted as they arrive during the drag."""
    async with LatencyClient(url, decode="none") as client:
        stats = client.assembler.stats

        async def count() -> dict[str, float | None]:
            frames0, t0 = stats.frames, time.monotonic()  # (the drag starts after a ping burst)
            await asyncio.sleep(seconds)
            elapsed = time.monotonic() - t0
            return {"seconds": elapsed, "shown": stats.frames - frames0, "decoded": None}

        window, report = await asyncio.gather(count(), client.measure(seconds))
    report["window"] = window
    return report


def measure(
    url: str, client: str, seconds: float, viewport: tuple[int, int], first_moves: int
) -> dict[str, Any]:
    if client == "chromium":
        # over the frames displayed during the drag, with the window's counts and answer SDP;
        # then the first moves after stillness, by the pixels
        return measure_in_chromium(
            url, seconds, viewport=viewport, before_drag=OPEN_WINDOW_JS,
            after_drag=CLOSE_WINDOW_JS, summary_script=SUMMARY_JS, first_moves=first_moves,
        )  # fmt: skip
    return asyncio.run(measure_in_python(url, seconds))


def figures(report: dict[str, Any]) -> dict[str, Any]:
    """The table's figures of either client's report (`cli.latency.rows` reads both)."""
    summaries = {name: s or {} for name, s in rows(report)}
    g2g, i2p = summaries.pop("glass-to-glass"), summaries.pop("input-to-frame")
    stages = {k: v.get("p50") for k, v in summaries.items()}
    window = report["window"]
    sdp = report.get("answerSdp")
    first = report.get("firstMove") or {}
    return {
        "first_move_p50": first.get("p50"),
        "first_move_p95": first.get("p95"),
        "first_move_max": first.get("max"),
        "first_moves": first.get("count"),
        "first_moves_unchanged": first.get("unchanged"),
        "first_moves_moving": first.get("moving"),
        "first_move_stages": first.get("stages") or {},
        "first_move_frames": first.get("frames"),
        "frames": report["frames"],  # displayed in the window with a timing record
        "shown": window["shown"],
        "decoded": window["decoded"],
        "window_s": window["seconds"],
        "fps": window["shown"] / window["seconds"],
        "playout_delay": None if sdp is None else PLAYOUT_DELAY_URI in sdp,
        "i2p_p50": i2p.get("p50"),
        "g2g_p50": g2g.get("p50"),
        "g2g_p95": g2g.get("p95"),
        **{f"{k}_p50": v for k, v in stages.items()},
    }


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _count(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _yes(value: bool | None) -> str:
    return "unknown" if value is None else "yes" if value else "NO"


def check_bare(report: dict[str, Any]) -> dict[str, Any]:
    """What the bare sender really ran: its answers' extension, its encoder's x264 options."""
    answers, x264 = report.get("answers") or [], report.get("x264")
    if not answers or not all(PLAYOUT_DELAY_URI in sdp for sdp in answers):
        raise RuntimeError("the bare sender's answer SDP lacks the playout-delay extension")
    if x264 is None:
        raise RuntimeError("the bare sender's stream carried no x264 SEI")
    wrong = {k: x264.get(k) for k, v in X264_EXPECTED.items() if x264.get(k) != v}
    if wrong:
        raise RuntimeError(f"the bare sender's x264 is not ultrafast + zerolatency: {wrong}")
    extmap = re.search(r"a=extmap:\d+ " + re.escape(PLAYOUT_DELAY_URI), answers[0])
    return {
        "extmap": extmap.group(0) if extmap else None,
        "x264": {k: x264[k] for k in X264_SHOWN if k in x264},
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )  # fmt: skip
    parser.add_argument("--seconds", type=float, default=10.0, help="drag (window) per run")
    parser.add_argument("--sizes", default="1280x720@30,1920x1080@60", help="WxH@fps,...")
    parser.add_argument("--client", choices=("chromium", "python"), default="chromium")
    parser.add_argument(
        "--first-moves", type=int, default=30,
        help="chromium: short drags after stillness per run, for the pixel meter (%(default)s)",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()

    results = []
    log_dir = Path(tempfile.mkdtemp(prefix="latency-bench-"))
    for size in args.sizes.split(","):
        dims, fps_text = size.split("@")
        width, height = (int(v) for v in dims.split("x"))
        fps = float(fps_text)
        viewport = (min(width, 1280), min(height, 720))
        with our_server(width, height, fps, log_dir) as url:
            ours = figures(measure(url, args.client, args.seconds, viewport, args.first_moves))
        bare: dict[str, Any] = {k: None for k in ours}
        checks: dict[str, Any] = {}
        if args.client == "chromium":  # the bare sender speaks no signaling protocol
            with bare_sender(width, height, fps) as (url, report):
                bare = figures(measure(url, args.client, args.seconds, viewport, args.first_moves))
            checks = check_bare(report)
        results.append({"size": size, "ours": ours, "bare": bare, "bare_checks": checks})
        print(f"measured {size}", file=sys.stderr, flush=True)

    if args.json:
        print(json.dumps({"client": args.client, "seconds": args.seconds, "results": results},
                         indent=2))  # fmt: skip
        return 0
    totals = ("i2p_p50", "g2g_p50", "first_move_p50")
    stage_names = [k for k in results[0]["ours"] if k.endswith("_p50") and k not in totals]
    counted = "displayed" if args.client == "chromium" else "received"
    print(f"latency on loopback, {args.client} client, {args.seconds:g} s drag per run, "
          f"{os.cpu_count()} CPUs; frames {counted} during the drag, ms")  # fmt: skip
    head = (f"{'size':<15}{'sender':<8}{'shown':>6}{'fps':>6}{'decoded':>8}{'timed':>6}"
            f"{'i2p p50':>9}{'g2g p50':>9}{'g2g p95':>9}")  # fmt: skip
    head += "".join(f"{name[:-4][:8]:>9}" for name in stage_names)
    print(head)
    for result in results:
        for who in ("ours", "bare"):
            f = result[who]
            line = f"{result['size']:<15}{who:<8}{_count(f['shown']):>6}{_count(f['fps'], 1):>6}"
            line += f"{_count(f['decoded']):>8}{_count(f['frames']):>6}{_ms(f['i2p_p50']):>9}"
            line += f"{_ms(f['g2g_p50']):>9}{_ms(f['g2g_p95']):>9}"
            line += "".join(f"{_ms(f[name]):>9}" for name in stage_names)
            print(line)
        ours, bare = result["ours"], result["bare"]
        if ours["g2g_p50"] and bare["g2g_p50"]:
            print(f"{'':<15}glass-to-glass p50, ours / bare: "
                  f"{ours['g2g_p50'] / bare['g2g_p50']:.2f}× (ours {ours['shown']} frames at "
                  f"{ours['fps']:.1f} fps, bare {bare['shown']} at {bare['fps']:.1f} fps, "
                  f"{ours['window_s']:.1f} s and {bare['window_s']:.1f} s drags)")  # fmt: skip
        if args.client == "chromium":
            for who in ("ours", "bare"):
                f = result[who]
                print(f"{'':<15}first move after stillness, by the pixels, {who}: p50 "
                      f"{_ms(f['first_move_p50'])} p95 {_ms(f['first_move_p95'])} max "
                      f"{_ms(f['first_move_max'])} ms over {_count(f['first_moves'])} moves "
                      f"({_count(f['first_moves_unchanged'])} changed nothing, "
                      f"{_count(f['first_moves_moving'])} on a moving picture)")  # fmt: skip
                stages = " ".join(
                    f"{name} {_ms(value)}" for name, value in f["first_move_stages"].items()
                )
                print(f"{'':<15}  their frames' records ({_count(f['first_move_frames'])} "
                      f"found), medians: {stages}")  # fmt: skip
            checks = result["bare_checks"]
            print(f"{'':<15}playout-delay extension in the answer: ours "
                  f"{_yes(ours['playout_delay'])}, bare {_yes(bare['playout_delay'])} "
                  f"({checks['extmap']})")  # fmt: skip
            x264 = " ".join(f"{k}={v}" for k, v in checks["x264"].items())
            print(f"{'':<15}bare x264, from its SEI: {x264}")
    if args.client == "chromium":
        print("shown = frames Chromium displayed during the drag (requestVideoFrameCallback), "
              "decoded = its framesDecoded over the same window, timed = the shown frames "
              "matched with a timing record (the percentiles are over these). bare = aiortc "
              "sending our libx264 settings' packets of a pre-made pattern encoded on its "
              "session thread: its 'render' is 0.")  # fmt: skip
    else:
        print("shown = frames the Python client received in the drag's window; timed = the "
              "frames of the whole measurement matched with a timing record (the percentiles "
              "are over these).")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
