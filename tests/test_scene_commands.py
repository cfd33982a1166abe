"""Scene commands of the data channel on real scenes, drawn by the real CPU renderer."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from render_server.protocol.data_channel import SceneCommand
from render_server.render import CpuRenderer, OrbitCamera, Scene
from render_server.render.sun import DEFAULT_HOUR
from render_server.stream.controls import CameraController
from render_server.stream.scene_commands import SceneCommands

W, H = 192, 108


def session(scene: Scene) -> SceneCommands:
    camera = OrbitCamera.framed_on(scene.bounds_min, scene.bounds_max)
    return SceneCommands(scene, CameraController(camera))


def run(commands: SceneCommands, name: str, role: str = "controller", **args: Any) -> Any:
    reply = commands.execute(SceneCommand(name, args, id=1), role)
    assert reply["type"] == "result", reply
    assert (reply["id"], reply["name"]) == (1, name)
    return reply["value"]


def refused(commands: SceneCommands, name: str, role: str = "controller", **args: Any) -> str:
    reply = commands.execute(SceneCommand(name, args, id=9), role)
    assert reply["type"] == "error" and reply["id"] == 9, reply
    assert set(reply) == {"type", "id", "code", "message"}
    return str(reply["code"])


def draw(commands: SceneCommands) -> tuple[np.ndarray, np.ndarray]:
    """The picture (int16) and, per pixel, the object drawn there (-1: floor or sky)."""
    scene = commands.scene()
    renderer = CpuRenderer(scene, W, H)
    picture = renderer.render(commands.controller.camera).astype(np.int16)
    ids = renderer._ids
    assert scene.object_ids is not None
    lookup = np.append(scene.object_ids, -1)  # ids of -1 (nothing drawn) index the last
    objects = lookup[np.where(ids >= 0, ids, len(scene.object_ids))]
    return picture, objects


def changed(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.abs(a - b).max(axis=2) > 2  # type: ignore[no-any-return]


def test_the_default_scene_lists_its_named_objects_materials_and_hour(scene: Scene) -> None:
    listing = run(session(scene), "listScene")
    assert {o["name"] for o in listing["objects"]} == {
        "ground", "red_sphere", "blue_box", "gold_torus",
        "white_cylinder", "green_capsule", "chrome_sphere",
    }  # fmt: skip
    objects = {o["name"]: o for o in listing["objects"]}
    assert objects["red_sphere"] == {
        "name": "red_sphere",
        "visible": True,
        "material": "glossy_red",
    }
    materials = {m["name"]: m for m in listing["materials"]}
    assert materials["gold"]["metallic"] == 1.0
    assert materials["glossy_red"]["roughness"] == 0.25
    assert all(len(m["color"]) == 7 and m["color"].startswith("#") for m in materials.values())
    assert listing["timeOfDay"] == DEFAULT_HOUR


def test_set_material_changes_that_objects_pixels_only(scene: Scene) -> None:
    commands = session(scene)
    before, objects = draw(commands)
    sphere = scene.objects.index("red_sphere")
    value = run(commands, "setMaterial", material="glossy_red", color="#20c040", roughness=0.6)
    assert value == {"name": "glossy_red", "color": "#20c040", "roughness": 0.6, "metallic": 0.0}
    after, objects_after = draw(commands)
    assert (objects_after == objects).all()  # the geometry is the same
    mask = objects == sphere
    assert mask.sum() > 200
    diff = changed(before, after)
    assert diff[mask].mean() > 0.9  # the sphere turned green ...
    assert not diff[~mask].any()  # ... and nothing else changed
    assert after[mask][:, 1].mean() > after[mask][:, 0].mean()
    listed = {m["name"]: m for m in run(commands, "listScene")["materials"]}
    assert listed["glossy_red"]["color"] == "#20c040"  # sRGB in, the same sRGB out


def test_set_visible_removes_and_restores_an_object(scene: Scene) -> None:
    commands = session(scene)
    before, objects = draw(commands)
    box = scene.objects.index("blue_box")
    assert run(commands, "setVisible", object="blue_box", visible=False) == {
        "name": "blue_box",
        "visible": False,
    }
    hidden, objects_hidden = draw(commands)
    assert not (objects_hidden == box).any()
    assert changed(before, hidden)[objects == box].mean() > 0.9
    listing = {o["name"]: o["visible"] for o in run(commands, "listScene")["objects"]}
    assert listing["blue_box"] is False and listing["red_sphere"] is True
    run(commands, "setVisible", object="blue_box", visible=True)
    again, _ = draw(commands)
    assert not changed(before, again).any()


def test_hiding_every_object_leaves_the_floor_and_sky(scene: Scene) -> None:
    commands = session(scene)
    for name in scene.objects:
        run(commands, "setVisible", object=name, visible=False)
    assert commands.scene().triangle_count == 0
    picture, objects = draw(commands)
    assert (objects == -1).all()
    assert picture.std() > 5  # floor and sky, not a blank picture


def test_time_of_day_moves_the_sun(scene: Scene) -> None:
    commands = session(scene)
    default, _ = draw(commands)
    assert run(commands, "setTimeOfDay", hours=DEFAULT_HOUR) == {"timeOfDay": DEFAULT_HOUR}
    same, _ = draw(commands)
    assert np.abs(default - same).max() <= 1  # the default sun is 15:00's
    run(commands, "setTimeOfDay", hours=12)
    noon, _ = draw(commands)
    run(commands, "setTimeOfDay", hours=0)
    midnight, _ = draw(commands)
    run(commands, "setTimeOfDay", hours=7)
    morning, _ = draw(commands)
    assert np.abs(noon - midnight).mean() > 10
    assert np.abs(noon - default).mean() > 2
    assert midnight.mean() < noon.mean()
    assert midnight.max() > 40  # moonlight: dark, never black
    # a low sun is warmer: more red than blue in the light it adds
    lit = morning - midnight
    assert lit[..., 0].mean() > lit[..., 2].mean()
    assert run(commands, "listScene")["timeOfDay"] == 7


def test_camera_commands(scene: Scene) -> None:
    commands = session(scene)
    start = run(commands, "getCamera")
    assert set(start) == {"yaw", "pitch", "distance", "target"}
    value = run(commands, "setCamera", yaw=1.0, pitch=2.0, distance=1e9, target=[0, 1, 2])
    assert value["yaw"] == 1.0
    assert value["pitch"] == pytest.approx(math.radians(89))  # clamped as the camera does
    assert value["distance"] == commands.controller.camera.max_distance
    assert value["target"] == [0.0, 1.0, 2.0]
    assert run(commands, "getCamera") == value
    assert run(commands, "resetCamera") == start


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("setMaterial", {"material": "unobtainium", "color": "#ffffff"}),
        ("setMaterial", {"material": "gold", "color": "gold"}),
        ("setMaterial", {"material": "gold", "color": "#ffff0"}),
        ("setMaterial", {"material": "gold", "roughness": 1.5}),
        ("setMaterial", {"material": "gold", "metallic": "1"}),
        ("setMaterial", {"material": "gold", "shininess": 1}),
        ("setMaterial", {"material": "x" * 65}),
        ("setMaterial", {}),
        ("setVisible", {"object": "red_sphere"}),
        ("setVisible", {"object": "red_sphere", "visible": 0}),
        ("setVisible", {"object": "no_such_thing", "visible": False}),
        ("setTimeOfDay", {"hours": 24.5}),
        ("setTimeOfDay", {"hours": -1}),
        ("setTimeOfDay", {}),
        ("setCamera", {"pitch": float("inf")}),
        ("setCamera", {"distance": 0}),
        ("setCamera", {"target": [0, 1]}),
        ("setCamera", {"target": [0, 1, "2"]}),
        ("setCamera", {"roll": 1}),
        ("getCamera", {"verbose": True}),
    ],
)
def test_bad_arguments_are_refused_and_change_nothing(
    scene: Scene, name: str, args: dict[str, Any]
) -> None:
    commands = session(scene)
    camera = commands.controller.camera.state()
    assert refused(commands, name, **args) == "bad_command"
    assert commands.scene() is scene
    assert commands.controller.camera.state() == camera


def test_unknown_commands_name_the_known_ones(scene: Scene) -> None:
    commands = session(scene)
    reply = commands.execute(SceneCommand("explode", {}, id=None))
    assert reply["code"] == "unknown_command" and reply["id"] is None
    assert all(name in reply["message"] for name in commands.names)


def test_a_viewer_may_only_read(scene: Scene) -> None:
    commands = session(scene)
    assert run(commands, "getCamera", role="viewer")
    assert run(commands, "listScene", role="viewer")
    for name, args in [
        ("setCamera", {"yaw": 1.0}),
        ("resetCamera", {}),
        ("setMaterial", {"material": "gold", "color": "#ffffff"}),
        ("setVisible", {"object": "ground", "visible": False}),
        ("setTimeOfDay", {"hours": 3}),
    ]:
        assert refused(commands, name, "viewer", **args) == "forbidden"
    assert commands.scene() is scene


def test_sessions_edit_their_own_scene(scene: Scene) -> None:
    built: list[Callable[[], Scene]] = []
    alice = SceneCommands(
        scene, CameraController(OrbitCamera.framed_on(scene.bounds_min, scene.bounds_max)),
        built.append,
    )  # fmt: skip
    bob = session(scene)
    materials = list(scene.materials)
    run(alice, "setMaterial", material="gold", color="#0000ff")
    run(alice, "setVisible", object="red_sphere", visible=False)
    run(alice, "setTimeOfDay", hours=19)
    assert len(built) == 3
    alices = built[-1]()
    assert alices.triangle_count < scene.triangle_count
    assert run(alice, "listScene") != run(bob, "listScene")
    # bob's scene, and the worker's, are untouched
    assert bob.scene() is scene and scene.materials == materials
    assert run(bob, "listScene")["timeOfDay"] == DEFAULT_HOUR
    bobs, _ = draw(bob)
    alice_picture, _ = draw(alice)
    assert np.abs(bobs - alice_picture).mean() > 5


def test_the_cuda_path_takes_edited_and_empty_scenes(scene: Scene) -> None:
    """CudaPictures over the CUDA kernels run on the host: a new scene builds a new renderer,
    and a scene with every object hidden still draws (the floor and the sky)."""
    from render_server.render.cuda.emulation import EmulatedCudaRenderer, compiler
    from render_server.stream.pictures import CpuPictures, CudaPictures, device_scene

    if compiler() is None:
        pytest.skip("no C++ compiler (g++ or $CXX) to build the kernels for the host")
    commands = session(scene)
    for name in scene.objects:
        run(commands, "setVisible", object=name, visible=False)
    empty = commands.scene()
    assert device_scene(empty).triangle_count == 1
    assert device_scene(scene) is scene

    def make(s: Scene) -> EmulatedCudaRenderer:
        return EmulatedCudaRenderer(s, W, H)

    cuda = CudaPictures(make(scene), "yuv420p", make)
    cpu = CpuPictures(CpuRenderer(scene, W, H))
    cam = commands.controller.camera
    full = cuda.picture(cam).to_ndarray().astype(np.int16)
    first = cuda.renderer
    cuda.set_scene(empty)
    cpu.set_scene(empty)
    assert cuda.renderer is not first
    bare = cuda.picture(cam).to_ndarray().astype(np.int16)
    assert np.abs(full - bare).mean() > 2
    # the same picture as the CPU renderer draws of the empty scene
    assert np.abs(bare - cpu.picture(cam).to_ndarray().astype(np.int16)).mean() < 1.0
    cuda.close()


def test_the_sky_follows_the_time_of_day(scene: Scene) -> None:
    commands = session(scene)
    skies = {}
    for hours in (12.0, 17.7, 0.0):
        run(commands, "setTimeOfDay", hours=hours)
        picture, _ = draw(commands)
        skies[hours] = picture[0].mean(axis=0)  # the top row: sky in the default view
    noon, dusk, night = skies[12.0], skies[17.7], skies[0.0]
    print(f"top row RGB: noon {noon.round()}, dusk {dusk.round()}, night {night.round()}")
    assert noon.mean() > dusk.mean() > night.mean()
    assert night.mean() > 5, "the night sky is dark, not black"
    # dusk warms the horizon: relative to noon, red holds up better than blue
    assert dusk[0] / noon[0] > dusk[2] / noon[2]
