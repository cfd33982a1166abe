"""What packing an H.264 frame into RTP payloads costs: aiortc's `H264Encoder.pack` against our
`transport/h264_packer.H264Packer`, on the same frames, in the same process, in turns.

    python benchmarks/h264_pack.py [--resolution 3840x2160] [--fps 60] [--bitrate 50000000]
        [--rounds 6]

The frames are the replay encoder's clip for that size, rate and bitrate (the CPU renderer and
libx264, as `render-server serve --encoder replay` streams them; built first, which takes a
while at 4K). Both packers run at the 1200-byte payload limit of the paced path
(`paced_negotiation`). Each round packs every frame of the clip once with each packer, in turns,
timed in thread CPU time. Printed per packer: frames, payloads, CPU seconds, microseconds a
frame; then the ratio aiortc / ours, and whether every frame gave the same payloads.
"""

from __future__ import annotations

import argparse
import sys
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the checkout's render_server, installed or not
import av  # noqa: E402
from aiortc.codecs import h264  # noqa: E402

from render_server.config import Resolution  # noqa: E402
from render_server.encode.replay import replay_clip  # noqa: E402
from render_server.render.builtin_scenes import default_scene  # noqa: E402
from render_server.transport.av1_codec import PAYLOAD_MAX  # noqa: E402
from render_server.transport.h264_packer import H264Packer  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--resolution", type=Resolution.parse, default=Resolution(3840, 2160))
    parser.add_argument("--fps", type=float, default=60.0)
    parser.add_argument("--bitrate", type=int, default=50_000_000)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()

    h264.PACKET_MAX = PAYLOAD_MAX
    started = time.monotonic()
    clip = replay_clip(default_scene(), args.resolution, args.fps, args.bitrate)
    print(f"clip: {len(clip.units)} frames of {args.resolution} at {args.fps:g} fps, "
          f"{clip.bytes_per_loop / len(clip.units) / 1e3:.1f} KB a frame on average, "
          f"built in {time.monotonic() - started:.1f} s")  # fmt: skip
    packets: list[av.Packet[Any]] = []
    for i, unit in enumerate(clip.units):
        packet = av.Packet(unit)
        packet.pts = i
        packet.time_base = Fraction(1, 90_000)
        packets.append(packet)

    packers = {"aiortc": h264.H264Encoder(), "ours": H264Packer()}
    same = all(packers["aiortc"].pack(p) == packers["ours"].pack(p) for p in packets)
    cpu = dict.fromkeys(packers, 0.0)
    payloads = dict.fromkeys(packers, 0)
    for _ in range(args.rounds):
        for name, packer in packers.items():
            t0 = time.thread_time()
            count = sum(len(packer.pack(p)[0]) for p in packets)
            cpu[name] += time.thread_time() - t0
            payloads[name] += count
    frames = args.rounds * len(packets)
    for name in packers:
        print(f"  {name:7} {frames:,} frames, {payloads[name]:,} payloads, {cpu[name]:.3f} CPU-s "
              f"-> {cpu[name] / frames * 1e6:.1f} us a frame")  # fmt: skip
    print(f"ratio aiortc / ours, CPU a frame: {cpu['aiortc'] / cpu['ours']:.2f}; "
          f"the same payloads for every frame: {'yes' if same else 'NO'}")  # fmt: skip
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
