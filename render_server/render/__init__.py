"""Rendering: the scene model and its loaders, the orbit camera, and the renderers."""

from render_server.render.camera import OrbitCamera
from render_server.render.cpu import CpuRenderer
from render_server.render.protocol import Renderer
from render_server.render.scene import (
    Material,
    Scene,
    SceneError,
    SceneLimits,
    default_scene,
    export_default_scene,
    load_scene,
)

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
