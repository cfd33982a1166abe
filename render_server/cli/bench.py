"""`render-server bench`: one session's whole frame path, per renderer/encoder pair and size."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from render_server.cli.options import SubParsers
from render_server.config import Resolution


def add_bench(sub: SubParsers) -> None:
    p = sub.add_parser(
        "bench",
        help="time render and encode per frame for each available backend",
        description="For each renderer/encoder pair this machine runs, time one session's whole "
        "frame path (render, convert, encode) with the camera moving every frame, and the "
        "frames per second one process sustains that way.",
    )
    p.add_argument("--resolutions", default="1280x720,1920x1080,3840x2160")
    p.add_argument("--seconds", type=float, default=3.0, help="per measurement (%(default)s)")
    p.add_argument(
        "--scene", type=Path, default=None,
        help="a glTF 2.0 (.glb/.gltf) or OBJ file to draw (default: the built-in scene)",
    )  # fmt: skip
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from render_server.backends.bench import bench_pipeline
    from render_server.backends.choice import Backends, choose_backends
    from render_server.render.builtin_scenes import default_scene
    from render_server.render.scene import SceneError
    from render_server.render.scene_files import load_scene

    logging.getLogger("render_server").setLevel(logging.ERROR)
    resolutions = [Resolution.parse(r) for r in args.resolutions.split(",")]
    auto = choose_backends("auto", "auto")
    pairs = {("cpu", "x264"), (auto.renderer, auto.encoder)}
    pairs |= {(auto.renderer, "x264"), ("cpu", auto.encoder)}
    try:
        scene = default_scene() if args.scene is None else load_scene(args.scene)
    except SceneError as exc:
        print(f"render-server: cannot load the scene: {exc}", file=sys.stderr)
        return 2
    if not args.json:
        print(f"scene: {args.scene or 'built-in'}, {scene.triangle_count} triangles")
    variants = []
    for renderer, encoder in sorted(pairs):
        device_too = (renderer, encoder) == ("cuda", "nvenc")
        for nvenc_input in ("host", "device") if device_too else ("host",):
            variants.append(
                Backends(renderer, encoder, "bench", "bench", encoder, auto.gpu, nvenc_input)
            )
    results = []
    for backends in variants:
        for resolution in resolutions:
            measured = bench_pipeline(scene, backends, resolution, args.seconds).as_dict()
            results.append(measured)
            if not args.json:
                stages = ", ".join(f"{k} {v:.2f}" for k, v in measured["stages_ms"].items())
                print(
                    f"{measured['what']:<22} {measured['resolution']:>9}  {stages}  "
                    f"-> {measured['fps']:.1f} fps sustained"
                )
    if args.json:
        print(json.dumps({"scene_triangles": scene.triangle_count, "results": results}, indent=2))
    return 0
