"""A designer's own model, measured: upload, switch, and the stream it gives in Chromium.

`render-server serve` (CPU renderer, x264, 1280x720 at 30 fps) with an upload folder, and
headless Chromium on the designer page, both on this machine:

1. Upload: `POST /api/scenes` of the model, `--runs` times (milliseconds, client side).
2. Switch: the page's Open model… to the `scene loaded` message (upload + fetch + check + parse
   + tables), against loading the same file in this process (`load_scene` + the CPU tables),
   which is what `serve --scene` pays once at start.
3. Stream: the page dragging the camera for `--seconds` (so that every frame is rendered anew),
   frames decoded and their rate, with the uploaded model against the built-in scene, alternating
   `--runs` times, same page size, same drag, same window of time.

    python benchmarks/scene_upload.py [--model PATH] [--seconds 8] [--runs 2] [--json]

The default model is the 121,496-triangle engine of Debian's `assimp-testmodels`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from render_server.render.cpu.prepare import prepare_scene  # noqa: E402
from render_server.render.scene_files import load_scene  # noqa: E402
from render_server.tools.local_server import local_server  # noqa: E402
from render_server.tools.measure.browser import CHROMIUM_ARGS, find_chromium  # noqa: E402

ENGINE = Path("/usr/share/assimp/models/glTF2/2CylinderEngine-glTF-Binary/2CylinderEngine.glb")
STATUS_DONE = """() => { const s = document.getElementById('scene-status');
  return s.textContent && !/Uploading|Loading/.test(s.textContent); }"""


def upload_ms(url: str, model: Path) -> float:
    data = model.read_bytes()
    request = urllib.request.Request(
        f"{url}/api/scenes?name={model.name}", data=data, method="POST",
        headers={"Content-Type": "model/gltf-binary"},
    )  # fmt: skip
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=60) as answer:
        answer.read()
    return (time.perf_counter() - start) * 1000


def in_process_ms(model: Path) -> float:
    start = time.perf_counter()
    prepare_scene(load_scene(model))
    return (time.perf_counter() - start) * 1000


def open_page(browser: Any, url: str) -> Any:
    page = browser.new_page(viewport={"width": 1280, "height": 720})
    page.goto(url + "/")
    page.wait_for_selector("body[data-state='streaming']", state="attached", timeout=30_000)
    page.wait_for_timeout(1000)
    return page


def switch_ms(page: Any, model: Path) -> float:
    start = time.perf_counter()
    page.set_input_files("#model-file", str(model))
    page.wait_for_function(STATUS_DONE, timeout=120_000)
    took = (time.perf_counter() - start) * 1000
    status = page.text_content("#scene-status") or ""
    if "triangles" not in status:
        raise RuntimeError(f"the model did not open: {status}")
    return took


def dragged_fps(page: Any, seconds: float) -> dict[str, float]:
    """Frames decoded while the mouse orbits the camera for `seconds`."""
    box = page.locator("#stage").bounding_box()
    cx, cy = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(cx, cy)
    page.mouse.down()
    before = page.evaluate("window.renderStream.stats().then(s => s.framesDecoded)")
    start = time.perf_counter()
    step = 0
    while time.perf_counter() - start < seconds:
        step += 1
        page.mouse.move(cx + 200 * ((step % 40) / 40 - 0.5), cy + 10 * (step % 7))
        page.wait_for_timeout(15)
    took = time.perf_counter() - start
    after = page.evaluate("window.renderStream.stats().then(s => s.framesDecoded)")
    page.mouse.up()
    frames = after - before
    return {"frames": frames, "seconds": took, "fps": frames / took}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=ENGINE)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    result: dict[str, Any] = {"model": str(args.model)}
    with tempfile.TemporaryDirectory() as work, local_server(
        "--resolution", "1280x720", "--fps", "30", "--scene-dir", f"{work}/scenes",
        log_path=Path(work) / "serve.log", cwd=ROOT,
    ) as server, sync_playwright() as p:  # fmt: skip
        result["upload_ms"] = [upload_ms(server.url, args.model) for _ in range(args.runs)]
        result["in_process_ms"] = [in_process_ms(args.model) for _ in range(args.runs)]
        browser = p.chromium.launch(
            executable_path=find_chromium(), headless=True, args=list(CHROMIUM_ARGS)
        )
        result["switch_ms"], result["model_stream"], result["builtin_stream"] = [], [], []
        for run in range(args.runs):
            for which in ("builtin", "model") if run % 2 == 0 else ("model", "builtin"):
                page = open_page(browser, server.url)
                if which == "model":
                    result["switch_ms"].append(switch_ms(page, args.model))
                    page.wait_for_timeout(1000)
                result[f"{which}_stream"].append(dragged_fps(page, args.seconds))
                page.close()
        browser.close()
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    median = statistics.median
    print(f"model: {args.model}")
    print(f"upload: median {median(result['upload_ms']):.0f} ms ({args.runs} runs)")
    switch, in_process = median(result["switch_ms"]), median(result["in_process_ms"])
    print(f"Open model… to loaded: median {switch:.0f} ms; "
          f"the same file loaded in process: median {in_process:.0f} ms")  # fmt: skip
    for which in ("model", "builtin"):
        runs = result[f"{which}_stream"]
        line = ", ".join(f"{r['frames']} frames / {r['seconds']:.1f} s = {r['fps']:.1f} fps"
                         for r in runs)  # fmt: skip
        print(f"{which:>8} dragged in Chromium: {line}")
    ratio = median(r["fps"] for r in result["model_stream"]) / median(
        r["fps"] for r in result["builtin_stream"]
    )
    print(f"model fps / built-in fps: {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
