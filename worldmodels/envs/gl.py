"""`headless_gl()`: choose MuJoCo's offscreen OpenGL (EGL, else OSMesa) before dm_control or
mujoco is imported, so rendering works on machines without a display."""

from __future__ import annotations

import ctypes.util
import os


def headless_gl() -> str | None:
    """Set `MUJOCO_GL` to EGL or OSMesa, whichever library exists; a value the user already
    exported wins. Returns the backend in use (None: MuJoCo's default)."""
    if "MUJOCO_GL" not in os.environ:
        for backend, library in (("egl", "EGL"), ("osmesa", "OSMesa")):
            if ctypes.util.find_library(library):
                os.environ["MUJOCO_GL"] = backend
                os.environ.setdefault("PYOPENGL_PLATFORM", backend)
                break
    return os.environ.get("MUJOCO_GL")
