"""MuJoCo's offscreen OpenGL: a `MUJOCO_GL` whose library is missing is refused, naming the variable and
what to install, before torchrl imports MuJoCo (which would fail deep inside PyOpenGL); a render that
fails says the same."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from worldmodels.envs import gl
from worldmodels.envs.suites import dmc


@pytest.mark.parametrize("backend, library", [("osmesa", "OSMesa"), ("egl", "EGL"), ("EGL", "EGL")])
def test_a_backend_whose_library_is_missing_is_refused_naming_it(monkeypatch, backend, library):
    monkeypatch.setenv("MUJOCO_GL", backend)
    with pytest.raises(gl.GLUnavailable, match=rf"MUJOCO_GL='{backend}': ImportError: lib{library} is not installed.*"
                                               r"unset MUJOCO_GL.*libosmesa6 for osmesa, libegl1 for egl"):
        gl.check_mujoco_gl(loads=lambda name: False)
    gl.check_mujoco_gl(loads=lambda name: True)  # installed: nothing to say


@pytest.mark.parametrize("backend", [None, "glfw", "disable"])
def test_other_settings_are_left_to_mujoco(monkeypatch, backend):
    if backend is None:
        monkeypatch.delenv("MUJOCO_GL", raising=False)
    else:
        monkeypatch.setenv("MUJOCO_GL", backend)
    gl.check_mujoco_gl(loads=lambda name: False)


def test_importing_the_training_stack_under_a_missing_osmesa_says_what_to_do():
    """The real import, in a fresh process: where OSMesa is missing (as on the CI machines) the error is
    ours; where it is installed, the import succeeds."""
    env = {**os.environ, "MUJOCO_GL": "osmesa"}
    done = subprocess.run([sys.executable, "-c", "import worldmodels.train"], capture_output=True, text=True,
                          env=env, timeout=300)
    if not gl.loadable("OSMesa"):
        assert done.returncode == 1
        assert done.stderr.strip().splitlines()[-1].startswith(
            "worldmodels.envs.gl.GLUnavailable: MuJoCo cannot render here (MUJOCO_GL='osmesa'"), done.stderr[-2000:]
    else:
        assert done.returncode == 0, done.stderr[-2000:]


def test_a_library_is_found_where_pyopengl_would_load_it():
    """The check loads as PyOpenGL does (dlopen, which reads LD_LIBRARY_PATH): libc loads, a made-up
    library does not."""
    assert gl.loadable("c") and not gl.loadable("NoSuchGLLibraryHere")


def test_a_render_that_fails_names_mujoco_gl(monkeypatch):
    """What a frameless replay's frames rendered again meet where GL fails past the import (a driver
    without the context MuJoCo asks for): PyOpenGL's AttributeError becomes GLUnavailable."""
    def no_gl(key):
        raise AttributeError("'NoneType' object has no attribute 'glGetError'")

    monkeypatch.setattr(dmc, "_physics", no_gl)
    with pytest.raises(gl.GLUnavailable, match=r"MuJoCo cannot render here \(MUJOCO_GL=.*AttributeError: 'NoneType'"):
        dmc.StateRenderer("cartpole/swingup", None, 16, 0)(np.zeros((2, 4)))
