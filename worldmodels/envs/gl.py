"""`headless_gl()`: choose MuJoCo's offscreen OpenGL (EGL, else OSMesa) before dm_control or
mujoco is imported, so rendering works on machines without a display; `check_mujoco_gl()`: refuse a
`MUJOCO_GL` whose library is missing before anything imports MuJoCo (torchrl does, on import, and
MuJoCo then fails deep inside PyOpenGL); `GLUnavailable`: what either says."""

from __future__ import annotations

import ctypes
import os

LIBRARIES = {"egl": "EGL", "osmesa": "OSMesa"}
"""MUJOCO_GL backend -> the library it loads (`lib<name>.so`)."""


def headless_gl() -> str | None:
    """Set `MUJOCO_GL` to EGL or OSMesa, whichever library exists; a value the user already
    exported wins. Returns the backend in use (None: MuJoCo's default)."""
    if "MUJOCO_GL" not in os.environ:
        for backend, library in LIBRARIES.items():
            if loadable(library):
                os.environ["MUJOCO_GL"] = backend
                os.environ.setdefault("PYOPENGL_PLATFORM", backend)
                break
    return os.environ.get("MUJOCO_GL")


class GLUnavailable(RuntimeError):
    """MuJoCo could not render in this process; the message names `MUJOCO_GL` and what to install."""

    def __init__(self, err: BaseException):
        backend = os.environ.get("MUJOCO_GL")
        super().__init__(
            f"MuJoCo cannot render here (MUJOCO_GL={backend!r}: {err.__class__.__name__}: {err}). Install the "
            "offscreen OpenGL library it needs (Debian: libosmesa6 for osmesa, libegl1 for egl), or set "
            "MUJOCO_GL=egl on a machine whose GPU driver provides EGL")


def loadable(library: str) -> bool:
    """Whether `lib<library>.so` (or `.so.9` ... `.so.0`) loads, as PyOpenGL looks for it (dlopen: the
    linker's paths and LD_LIBRARY_PATH, which `ctypes.util.find_library` may not search)."""
    for name in [f"lib{library}.so", *(f"lib{library}.so.{i}" for i in reversed(range(10)))]:
        try:
            ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
        except OSError:
            continue
        return True
    return False


def check_mujoco_gl(loads=loadable) -> None:
    """Raise GLUnavailable where the exported `MUJOCO_GL` names a backend whose library does not load
    (`loads`; importing MuJoCo would fail inside PyOpenGL). Imports nothing."""
    backend = os.environ.get("MUJOCO_GL", "").lower()
    library = LIBRARIES.get(backend)
    if library is not None and not loads(library):
        raise GLUnavailable(ImportError(f"lib{library} is not installed, so MuJoCo cannot be imported; unset "
                                        "MUJOCO_GL to let worldmodels pick the backend that is installed"))
