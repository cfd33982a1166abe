"""The one error of this layer: a file that cannot become a scene, with a message for a designer."""

from __future__ import annotations


class SceneError(ValueError):
    """A scene that cannot be used; the message names the file, the problem and any limit."""
