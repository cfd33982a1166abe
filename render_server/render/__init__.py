"""Rendering: the scene model and its loaders, the orbit camera, and the renderers.

scene.py           the scene model (triangles, materials, sun)
scene_files.py     glTF and OBJ files into a Scene, through trimesh
builtin_scenes.py  the default scene, and a dense one for load tests
sun.py             the sun for a time of day
camera.py          the orbit camera
protocol.py        what the worker asks of a renderer
cpu/               the CPU renderer (numba)
cuda/              the CUDA renderer, and its host emulation for tests
bands.py           a frame's rows in bands on a shared thread pool
"""

from render_server.render.builtin_scenes import default_scene, export_default_scene
from render_server.render.camera import OrbitCamera
from render_server.render.cpu import CpuRenderer
from render_server.render.protocol import Renderer
from render_server.render.scene import Material, Scene, SceneError
from render_server.render.scene_files import SceneLimits, load_scene

__all__ = [
    "CpuRenderer",
    "Material",
    "OrbitCamera",
    "Renderer",
    "Scene",
    "SceneError",
    "SceneLimits",
    "default_scene",
    "export_default_scene",
    "load_scene",
]
