"""The capacity benchmark's kernel sink (benchmarks/kernel_sink.py), in a network namespace of its
own: every media packet but a frame's last is dropped where it enters, each counted once, and
everything else (frame ends, RTCP, STUN, DTLS) reaches the socket, also when the sender cuts a
run of datagrams with UDP_SEGMENT."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import kernel_sink  # noqa: E402

pytestmark = pytest.mark.skipif(
    kernel_sink.missing() is not None, reason=f"kernel sink: {kernel_sink.missing()}"
)

# Runs in the namespace: sends what a server sends, and prints what the receiver got and what
# the rules counted.
SCRIPT = r"""
import json, socket, struct, sys, time
sys.path.insert(0, sys.argv[1])
import kernel_sink

def rtp(seq, marker, size, pt=96):
    header = struct.pack("!BBHII", 0x80, pt | (0x80 if marker else 0), seq, seq * 3000, 7)
    return header + bytes(size - 12)

kernel_sink.prepare_namespace()
address = kernel_sink.ADDRESS.split("/")[0]
receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
receiver.bind((address, 0))
receiver.settimeout(0.5)
sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sender.connect(receiver.getsockname())
got = []
with kernel_sink.KernelSink() as sink:
    seq = 0
    for frame in range(20):  # one datagram at a time: 9 packets a frame, the last a marker
        for i in range(9):
            sender.send(rtp(seq, i == 8, 1200 if i < 8 else 300)); seq += 1
    # a segmented run: 7 datagrams of 1200 bytes, the last shorter and a frame's end
    run = b"".join(rtp(seq + i, False, 1200) for i in range(6)) + rtp(seq + 6, True, 500)
    seq += 7
    sender.sendmsg([run], [(17, 103, struct.pack("=H", 1200))])  # SOL_UDP, UDP_SEGMENT
    sender.send(struct.pack("!BBH", 0x80, 200, 6) + bytes(24))  # RTCP sender report
    sender.send(b"\x00\x01\x00\x00" + bytes(16))  # STUN binding request
    sender.send(b"\x17\xfe\xfd" + bytes(30))  # DTLS application data
    sender.send(rtp(seq, False, 900, pt=0))  # RTP of a static payload type: passed
    try:
        while True:
            got.append(receiver.recv(65536))
    except socket.timeout:
        pass
    time.sleep(2 * kernel_sink.SAMPLE_S)
    now = sink.counts()
    window = sink.between(sink.samples[0][0], sink.samples[-1][0])
print(json.dumps({"got": [[len(d), d[0], d[1]] for d in got], "counts": now, "window": window}))
"""


def test_media_is_dropped_and_counted_frame_ends_and_control_pass() -> None:
    done = subprocess.run(
        ["unshare", "--net", "--", sys.executable, "-c", SCRIPT, str(ROOT / "benchmarks")],
        capture_output=True,
        text=True,
        timeout=60,
        env={kernel_sink.ENV: "1", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    got = result["got"]
    markers = [g for g in got if 128 <= g[0] and g[1] == 0x80 and g[2] >= 224]
    assert [g[0] for g in markers] == [300] * 20 + [500]  # every frame end, each once
    assert [g[2] for g in got if g[1] == 0x80 and g[2] == 200] == [200]  # RTCP
    assert [g[1] for g in got if g[1] in (0x00, 0x17)] == [0x00, 0x17]  # STUN, DTLS
    assert [g[0] for g in got if g[1] == 0x80 and g[2] == 0] == [900]  # not a dynamic type
    assert len(got) == 25  # and no media packet without the marker
    counts = kernel_sink.Counts(*result["counts"])
    # 20 × 8 + 6 dropped (the segmented run cut before the rules: each datagram counted)
    assert counts.dropped == 166
    assert counts.markers == 21
    assert counts.dropped_bytes == 166 * (1200 + 28)
    assert counts.marker_bytes == 20 * (300 + 28) + (500 + 28)
    assert kernel_sink.Counts(*result["window"]) == counts  # the samples cover it all
