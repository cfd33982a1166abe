"""The load-test harness decoding every frame of every stream (issue 18): NVDEC against the CPU
decoder, in the same run.

    python benchmarks/harness_decode.py [--streams 20] [--resolution 3840x2160] [--fps 30]
        [--bitrate 15000000] [--duration 30] [--ramp 10] [--processes 4] [--decoders cpu,nvdec]
        [--min-fps 29]

One `render-server serve --encoder replay` (every stream sends the same pre-encoded clip, so
each decoder gets the same frames), then one `render-server loadtest --decode all --decoder D`
against it per decoder, one after the other: every frame of every stream decoded in order, in
one decoder per stream, as a browser would. Printed per decoder: the frames decoded, dropped (the
decoder fell `decoding.BACKLOG` frames behind) and undecodable, the decode time per frame (the
median of the streams' medians, and the worst stream's p95), the hold's frame rates, the
harness's cores and its CPU milliseconds per decoded frame (receiving included, the same on both
sides); then NVDEC against the CPU decoder as ratios. A decoder that does not open here (`nvdec`
without an NVIDIA GPU, or a PyAV without `h264_cuvid`) is reported as such and not run.

On the 2-core development VM only small runs fit (`--streams 2 --resolution 1280x720
--decoders cpu`); the claim it is for, 20 × 4K decoded by one harness, needs a GPU machine
(`benchmarks/gpu_check.sh` runs it there).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loadtest import describe, held, loadtest, serve  # noqa: E402  (benchmarks/loadtest.py)

from render_server.tools.loadtest.decoding import DecoderUnavailable, pick_decoder  # noqa: E402


def _summary(report: dict[str, Any]) -> dict[str, Any]:
    decode = report["aggregate"]["decode"] or {}
    decoded = decode.get("decoded", 0)
    cpu_s = report["harness"]["cpu_s"]
    return {
        "decoded": decoded,
        "dropped": decode.get("dropped", 0),
        "undecodable": decode.get("undecodable", 0),
        "ms_p50": decode.get("ms_p50"),
        "ms_p95_worst": decode.get("ms_p95_worst"),
        "frames": report["aggregate"]["frames"],
        "cpu_ms_per_frame": 1e3 * cpu_s / decoded if decoded else None,
    }


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=20)
    parser.add_argument("--resolution", default="3840x2160")
    parser.add_argument("--fps", type=float, default=30.0)
    parser.add_argument("--bitrate", type=int, default=15_000_000, help="each stream's, bits/s")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds each run holds")
    parser.add_argument("--ramp", type=float, default=10.0)
    parser.add_argument("--processes", type=int, default=4, help="the harness's processes")
    parser.add_argument("--decoders", default="cpu,nvdec", help="run in this order")
    parser.add_argument("--min-fps", type=float, default=None, help="held at (default: fps − 1)")
    args = parser.parse_args()
    decoders = [d.strip() for d in args.decoders.split(",") if d.strip()]
    if not decoders or set(decoders) - {"cpu", "nvdec"}:
        parser.error("--decoders: cpu, nvdec or both")
    work = Path(tempfile.mkdtemp(prefix="harness-decode-"))
    t0 = time.monotonic()
    results: dict[str, dict[str, Any]] = {}
    serve_args = ("--encoder", "replay", "--resolution", args.resolution, "--fps", f"{args.fps:g}",
                  "--bitrate", str(args.bitrate), "--slots", str(args.streams))  # fmt: skip
    floor = args.fps - 1 if args.min_fps is None else args.min_fps
    with serve(*serve_args, log=work / "serve.log") as (url, pid, command):
        print("server: python " + " ".join(command[1:]))
        for decoder in decoders:
            try:
                name, kind = pick_decoder(decoder, "H264")
            except DecoderUnavailable as exc:
                print(f"--decoder {decoder}: not run ({exc})")
                continue
            report, server_cpu, how = loadtest(
                url, pid, work / decoder, "--streams", str(args.streams),
                "--resolution", args.resolution, "--fps", f"{args.fps:g}",
                "--duration", f"{args.duration:g}", "--ramp", f"{args.ramp:g}",
                "--processes", str(args.processes), "--decode", "all", "--decoder", decoder,
                "--min-fps", f"{floor:g}",
            )  # fmt: skip
            summary = results[decoder] = _summary(report)
            verdict = "held" if held(report, floor) else "NOT held"
            print(
                f"[{time.monotonic() - t0:5.0f} s] --decoder {decoder} ({name}, {kind}): "
                f"{summary['decoded']:,} of {summary['frames']:,} frames decoded, "
                f"{summary['dropped']:,} dropped, {summary['undecodable']:,} undecodable; "
                f"decode {_ms(summary['ms_p50'])} ms a frame (p95 worst stream "
                f"{_ms(summary['ms_p95_worst'])}); harness "
                f"{_ms(summary['cpu_ms_per_frame'])} CPU-ms per decoded frame; {verdict} at "
                f"≥ {floor:g} fps: {describe(report, server_cpu)}\n    {how}",
                flush=True,
            )
    cpu, gpu = results.get("cpu"), results.get("nvdec")
    if cpu and gpu:
        ratios = []
        for key, label in (("ms_p50", "decode ms a frame"),
                           ("cpu_ms_per_frame", "harness CPU-ms per decoded frame")):  # fmt: skip
            if cpu[key] and gpu[key]:
                ratios.append(f"{label} {gpu[key] / cpu[key]:.2f}×")
        print("nvdec against cpu: " + ("; ".join(ratios) or "nothing to compare"))
    print(f"reports under {work}")
    return 0 if results else 1


if __name__ == "__main__":
    sys.exit(main())
