"""The capacity benchmark's kernel sink (benchmarks/kernel_sink.py), in a network namespace of its
own: every media packet but a frame's last is dropped where it enters, each counted once, and
everything else (frame ends, RTCP, STUN, DTLS) reaches the socket, also when the sender cuts a
run of datagrams with UDP_SEGMENT; and a benchmark killed in it leaves no server behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
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


INNER = r"""
import subprocess, sys, time
subprocess.Popen(["sleep", sys.argv[1]])  # stands for a server the benchmark started
time.sleep(300)
"""


def _processes(*argv: str) -> list[int]:
    """Host pids of the live processes whose command line starts with `argv`."""
    prefix = "\0".join(argv).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_bytes()
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if command.startswith(prefix) and state != "Z":
                found.append(int(entry.name))
    return found


@pytest.mark.parametrize("killed", ["the benchmark", "its run in the namespace"])
def test_what_the_benchmark_started_dies_with_it(tmp_path: Path, killed: str) -> None:
    """`reexec`: a benchmark killed with SIGKILL (or its run in the namespace) leaves no server
    behind: the namespace's first process takes every other with it."""
    marker = f"{300 + time.time() % 1:.6f}"  # the stand-in server's unique `sleep` argument
    inner = tmp_path / "inner.py"
    inner.write_text(INNER)
    outer = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import kernel_sink;"
         " sys.exit(kernel_sink.reexec(sys.argv[2], sys.argv[3:]))",
         str(ROOT / "benchmarks"), str(inner), marker],
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        server = ("sleep", marker)
        while not _processes(*server) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _processes(*server), "the stand-in server never started"
        running = _processes(sys.executable, str(inner))
        assert len(running) == 1, "no run in the namespace"
        os.kill(outer.pid if killed == "the benchmark" else running[0], signal.SIGKILL)
        deadline = time.monotonic() + 10
        while _processes(*server) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _processes(*server) == [], "the stand-in server outlived the benchmark"
    finally:  # where the test fails, nothing of it is left running either
        outer.kill()
        outer.wait()
        for pid in _processes(sys.executable, str(inner)) + _processes("sleep", marker):
            os.kill(pid, signal.SIGKILL)
