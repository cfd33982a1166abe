"""A designer's own model through the page, in real headless Chromium against `render-server
serve`: chosen or dropped, uploaded, streamed (checked by pixels); bad files get their error on
the page while the stream goes on."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trimesh

from .browser import chromium_page, serve_process
from .test_browser import grab
from .test_upload_file import glb_with_json, zip_of

pytestmark = pytest.mark.browser

MAX_SCENE_BYTES = 400_000


def magenta_ball_glb() -> bytes:
    """A big magenta ball: nothing in the default scene has this colour."""
    mesh = trimesh.creation.icosphere(subdivisions=3, radius=1.0)
    mesh.visual = trimesh.visual.TextureVisuals(
        material=trimesh.visual.material.PBRMaterial(
            baseColorFactor=[220, 20, 220, 255], metallicFactor=0.0, roughnessFactor=0.6
        )
    )
    data = trimesh.Scene({"magenta_ball": mesh}).export(file_type="glb")
    assert isinstance(data, bytes)
    return data


def zip_bomb() -> bytes:
    return zip_of({"model.obj": b"v 0 0 0\n" + b"#" * 3_000_000})


@pytest.fixture(scope="module")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    base = tmp_path_factory.mktemp("serve-scenes")
    with serve_process(
        "--resolution", "640x360", "--fps", "30", "--scene-dir", str(base / "scenes"),
        "--max-scene-bytes", str(MAX_SCENE_BYTES), log_path=base / "serve.log",
    ) as url:  # fmt: skip
        yield url


@pytest.fixture
def page(server_url: str) -> Iterator[Any]:
    with chromium_page() as page:
        page.goto(server_url + "/")
        page.wait_for_selector("body[data-state='streaming']", state="attached", timeout=20_000)
        yield page


def magenta_share(picture: np.ndarray) -> float:
    r, g, b = (picture[..., i].astype(np.float64) for i in range(3))
    return float(((r > 80) & (b > 80) & (1.6 * g < np.minimum(r, b))).mean())


def scene_status(page: Any, timeout_ms: float = 30_000) -> tuple[str, bool]:
    """The upload's final line on the page (after the progress lines) and whether it is an error."""
    page.wait_for_function(
        """() => { const s = document.getElementById('scene-status');
                   return s.textContent && !/Uploading|Loading/.test(s.textContent); }""",
        timeout=timeout_ms,
    )
    text = page.text_content("#scene-status") or ""
    error = "error" in (page.get_attribute("#scene-status", "class") or "")
    return text, error


def frames_decoded(page: Any) -> int:
    return int(page.evaluate("window.renderStream.stats().then(s => s.framesDecoded)"))


def choose(page: Any, name: str, data: bytes, mime: str = "application/octet-stream") -> None:
    page.evaluate("document.getElementById('scene-status').textContent = ''")
    page.set_input_files("#model-file", files=[{"name": name, "mimeType": mime, "buffer": data}])


def test_a_chosen_model_replaces_the_scene_in_the_stream(page: Any, output_dir: Path) -> None:
    page.wait_for_timeout(800)
    before = grab(page)
    assert magenta_share(before) < 0.01, "the default scene already shows this colour"
    choose(page, "ball.glb", magenta_ball_glb(), "model/gltf-binary")
    text, error = scene_status(page)
    assert not error, text
    assert text.startswith("ball.glb: ") and "triangles" in text, text
    page.wait_for_timeout(800)
    after = grab(page)
    page.screenshot(path=str(output_dir / "scene-upload-ball.png"))
    # the camera is framed on the ball: it fills a good part of the picture
    assert magenta_share(after) > 0.10, f"green share {magenta_share(after):.3f}"
    assert page.evaluate("document.body.dataset.state") == "streaming"


def test_a_dropped_model_opens_too(page: Any) -> None:
    encoded = base64.b64encode(magenta_ball_glb()).decode()
    page.evaluate(
        """(data) => {
          const bytes = Uint8Array.from(atob(data), (c) => c.charCodeAt(0));
          const transfer = new DataTransfer();
          transfer.items.add(new File([bytes], 'dropped.glb', { type: 'model/gltf-binary' }));
          const stage = document.getElementById('stage');
          const init = { dataTransfer: transfer, bubbles: true, cancelable: true };
          stage.dispatchEvent(new DragEvent('dragover', init));
          stage.dispatchEvent(new DragEvent('drop', init));
        }""",
        encoded,
    )
    text, error = scene_status(page)
    assert not error and text.startswith("dropped.glb: "), text
    page.wait_for_timeout(800)
    assert magenta_share(grab(page)) > 0.10


BAD_FILES = [
    # (name, bytes, words the page's message must hold)
    ("photo.glb", b"\x89PNG\r\n\x1a\n" + b"\0" * 2000, "PNG"),
    ("huge.glb", b"glTF" + b"\0" * (MAX_SCENE_BYTES + 10), "limit"),
    ("bomb.zip", zip_bomb(), "compress"),
    ("notes.txt", b"hello", "not a model"),
    ("broken.glb", glb_with_json(b'{"asset": {"version": "2.0"}, "meshes": [}'), "JSON"),
]


def test_bad_files_get_their_error_while_the_stream_goes_on(page: Any) -> None:
    page.wait_for_timeout(500)
    before = grab(page)
    for name, data, words in BAD_FILES:
        decoded = frames_decoded(page)
        choose(page, name, data)
        text, error = scene_status(page)
        print(f"{name}: {text}")
        assert error, f"{name}: {text}"
        assert words.lower() in text.lower(), f"{name}: {text!r} does not say {words!r}"
        assert page.evaluate("document.body.dataset.state") == "streaming"
        page.wait_for_timeout(400)
        assert frames_decoded(page) > decoded, f"the stream stalled after {name}"
    # the scene shown is still the default one
    assert np.abs(grab(page) - before).mean() < 4.0
