"""`render-server loadtest`: many real WebRTC viewers against a server, and what held."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from render_server.cli.options import SubParsers
from render_server.config import Resolution
from render_server.encode.codecs import CODECS

EXIT_PASS, EXIT_FAIL, EXIT_USAGE = 0, 1, 2

EPILOG = """\
examples:
  # the packet path alone, no GPU: a pre-encoded clip replayed by every session
  render-server serve --encoder replay --resolution 1280x720 --fps 30 --bitrate 4000000 \\
      --slots 20 --port 8080 &
  render-server loadtest --server http://127.0.0.1:8080 --streams 20 --resolution 1280x720 \\
      --fps 30 --duration 30 --ramp 5 --processes 2 --min-fps 29 --report out/

  # the 20 × 4K acceptance run on a GPU worker with NVENC (rendered and encoded for real)
  render-server serve --host 0.0.0.0 --renderer cuda --encoder nvenc --resolution 3840x2160 \\
      --fps 60 --bitrate 25000000 --slots 20 --animate --secret $SECRET &
  render-server loadtest --server http://GPU-HOST:8080 --token "$(render-server token \\
      --role viewer --secret $SECRET)" --streams 20 --resolution 3840x2160 --fps 60 \\
      --duration 60 --ramp 10 --processes 8 --min-fps 58 --max-p95-ms 50 --report out/

Each stream drags the camera on its data channel as a designer would (a pattern seeded by
--seed and the stream's number), so the worker renders every frame; --no-drag only watches (a
still picture then repeats at the worker's --idle-fps, half the rate by default, and fails the
default floor). A stream that never gets a frame (queued the whole run) fails. Receiving
is CPU work too: run the harness on other cores or another machine, with enough --processes
(report.json gives each one's CPU time). report.json says which worker mode ran (replay,
x264, nvenc) and sets the worker's /metrics counters beside the harness's totals."""


def _seconds(text: str) -> float:
    """`10`, `10s` or `1.5s` → seconds."""
    try:
        return float(text[:-1] if text.endswith("s") else text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None


def add_loadtest(sub: SubParsers) -> None:
    p = sub.add_parser(
        "loadtest",
        help="open many streams on a server as real WebRTC peers and report what held",
        description="Open --streams sessions on a running server through its signaling API, "
        "as real aiortc peers (ICE, DTLS, SRTP) spread over --processes processes, ramping up "
        "over --ramp seconds and holding for --duration. Frames are assembled on the RTP marker "
        "bit (a keyframe decoded now and then, to check the picture), latency comes from the "
        "worker's timing records. Writes DIR/report.json and DIR/report.html and prints a "
        "summary ending in PASS or FAIL. Exit status: 0 pass, 1 fail, 2 usage or connection "
        "error. Start the server with --slots at least --streams.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--server", required=True, metavar="URL", help="http(s)://host:port")
    p.add_argument("--streams", type=int, default=20, help="concurrent sessions (%(default)s)")
    p.add_argument("--resolution", default="3840x2160", help="WIDTHxHEIGHT asked for (%(default)s)")
    p.add_argument("--fps", type=float, default=60.0, help="frame rate asked for (%(default)s)")
    p.add_argument("--max-kbps", type=int, help="bitrate cap asked for (default: the worker's)")
    p.add_argument(
        "--codec",
        type=str.upper,
        default="H264",
        choices=CODECS,
        help="the codec each stream asks for (%(default)s)",
    )
    p.add_argument("--duration", type=_seconds, default=60.0,
                   help="seconds of hold after the ramp (%(default)s)")  # fmt: skip
    p.add_argument("--ramp", type=_seconds, default=10.0,
                   help="seconds over which the streams start, evenly (%(default)s)")  # fmt: skip
    p.add_argument("--processes", type=int, default=1,
                   help="harness processes sharing the streams (%(default)s)")  # fmt: skip
    p.add_argument("--token", help="a viewer or controller token, where the server asks for one")
    p.add_argument(
        "--decode",
        nargs="+",
        default=["keyframes"],
        metavar="MODE",
        help="keyframes: a sampled keyframe (once per --decode-every frames); every N:"
        " the same, once per N frames (a P-frame cannot be decoded without every "
        "frame back to its keyframe); all: every frame, in order (not with --receiver "
        "count); none (keyframes)",
    )
    p.add_argument(
        "--decoder",
        choices=("auto", "cpu", "nvdec"),
        default="auto",
        help="nvdec: FFmpeg's cuvid decoders on an NVIDIA GPU; auto: nvdec where it "
        "opens, else cpu (%(default)s)",
    )
    p.add_argument("--decode-every", type=int, default=30, metavar="N",
                   help="decode a keyframe at most once per N frames per stream; 0: never "
                   "(%(default)s)")  # fmt: skip
    p.add_argument("--setup-timeout", type=_seconds, default=30.0,
                   help="seconds from request to first frame before a stream counts as failed "
                   "(%(default)s)")  # fmt: skip
    p.add_argument(
        "--min-fps",
        type=float,
        help="FAIL when a stream's fps over the hold is lower (default: 95 %% of --fps)",
    )
    p.add_argument(
        "--no-drag", action="store_true", help="send no input: watch a still camera, as a viewer"
    )
    p.add_argument("--receiver", choices=("lean", "full", "count"), default="lean",
                   help="lean: count frames on the marker bit straight from the decrypted RTP "
                   "(receiver reports only, no NACK); full: aiortc's whole receive path; "
                   "count: packets and frames from the SRTP headers in the clear, only the "
                   "sampled keyframes decrypted and decoded (%(default)s)")  # fmt: skip
    p.add_argument("--transport-feedback", action="store_true",
                   help="each stream sends transport-cc feedback every 50 ms as a browser does "
                   "(lean and count: packets timed by the kernel's receive stamps), so that the "
                   "worker paces and runs its congestion controller as for browsers; without it "
                   "the worker follows REMB and sends at once")  # fmt: skip
    p.add_argument("--wake-interval-ms", type=float, metavar="MS",
                   help="each harness process looks at its sockets at most every MS ms, "
                   "reading what came meanwhile at once (arrival times stay the kernel's "
                   "receive stamps); 0: as packets come (default: 5 with --receiver count, "
                   "else 0)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the streams' drag patterns (%(default)s)")  # fmt: skip
    p.add_argument("--max-p95-ms", type=float,
                   help="FAIL when a stream's p95 frame latency, plus how far its clock "
                   "alignment may be off, is higher")  # fmt: skip
    p.add_argument("--report", required=True, metavar="DIR", help="where report.json/.html go")
    p.add_argument("--json", action="store_true", help="print report.json instead of the summary")
    p.add_argument("--no-progress", action="store_true", help="no live display")
    p.set_defaults(func=run_loadtest_cli)


def run_loadtest_cli(args: argparse.Namespace) -> int:
    from render_server.tools.loadtest.config import LoadTestConfig
    from render_server.tools.loadtest.runner import HarnessError, run_loadtest
    from render_server.tools.loadtest.server import ServerUnreachable

    try:
        decode, every = _decode_mode(args.decode, args.decode_every)
        config = LoadTestConfig(
            server=args.server, streams=args.streams, resolution=Resolution.parse(args.resolution),
            fps=args.fps, duration_s=args.duration, ramp_s=args.ramp, processes=args.processes,
            token=args.token, max_kbps=args.max_kbps, decode_every=every,
            setup_timeout_s=args.setup_timeout, min_fps=args.min_fps, max_p95_ms=args.max_p95_ms,
            codec=args.codec, drag=not args.no_drag, seed=args.seed,
            receiver=args.receiver, decode=decode, decoder=args.decoder,
            transport_feedback=args.transport_feedback, wake_interval_ms=args.wake_interval_ms,
        )  # fmt: skip
    except ValueError as exc:  # a ConfigError: a value the load test cannot use
        print(f"render-server loadtest: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if config.decode_mode != "none" and config.decoder != "cpu":
        from render_server.tools.loadtest.decoding import DecoderUnavailable, pick_decoder

        try:
            pick_decoder(config.decoder, config.codec)
        except DecoderUnavailable as exc:
            print(f"render-server loadtest: {exc}", file=sys.stderr)
            return EXIT_USAGE
    missing = _missing_extras(progress=not args.json and not args.no_progress)
    if missing:
        print(f"render-server loadtest: {', '.join(missing)} missing: install the loadtest "
              "extra (pip install -e '.[loadtest]')", file=sys.stderr)  # fmt: skip
        return EXIT_USAGE
    directory = Path(args.report)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"render-server loadtest: cannot write the report to {directory}: {exc}",
              file=sys.stderr)  # fmt: skip
        return EXIT_USAGE
    display = None
    if not args.json and not args.no_progress:
        from render_server.tools.loadtest.progress import LiveDisplay

        display = LiveDisplay(config)
    try:
        run = run_loadtest(config, display)
    except (ServerUnreachable, HarnessError) as exc:
        print(f"render-server loadtest: {exc}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        if display is not None:
            display.stop()
    from render_server.tools.loadtest.report import write_report

    report, summary = write_report(run, directory)
    print(json.dumps(report, indent=2) if args.json else summary)
    return EXIT_PASS if report["verdict"]["passed"] else EXIT_FAIL


def _decode_mode(words: list[str], every: int) -> tuple[str, int]:
    """`--decode` → (mode, keyframe sampling interval); ValueError names what is wrong."""
    if len(words) == 1 and words[0] in ("all", "keyframes", "none"):
        return words[0], every
    if len(words) == 2 and words[0] == "every" and words[1].isdigit() and int(words[1]) >= 1:
        return "keyframes", int(words[1])
    raise ValueError(
        f"--decode must be all, keyframes, every N (N ≥ 1) or none, not {' '.join(words)!r}"
    )


def _missing_extras(progress: bool) -> list[str]:
    """The optional packages this run needs and cannot import (before minutes of load, not
    after)."""
    import importlib.util

    wanted = ["matplotlib"] + (["rich"] if progress else [])
    return [name for name in wanted if importlib.util.find_spec(name) is None]
