"""Rendering: the scene model and its loaders, the orbit camera, and the renderers."""

from .camera import OrbitCamera
from .cpu import CpuRenderer
from .protocol import Renderer
from .scene import (
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
