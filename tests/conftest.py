"""Shared fixtures: every test leaves the recurrent core's settings as it found them.

Triton's kernels run on CPU tensors under its interpreter, which must be on before triton is
first imported (torch.compile imports it too): set here, before anything imports torch, so the
`triton` backend is available on CPU and the registry-parametrised tests cover it (tiny shapes).
Set WORLDMODELS_TEST_DEVICE=cuda on a GPU machine to run the kernels compiled instead.

Under pytest-xdist (`-n 2`, what CI runs) each worker keeps torch to one thread, so the workers
do not oversubscribe the cores (most tests are small ops bound by Python overhead).
"""

from __future__ import annotations

import os

if os.environ.get("WORLDMODELS_TEST_DEVICE", "cpu") == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from worldmodels.core import set_recurrent_backend, set_recurrent_matmul_precision, set_recurrent_mode  # noqa: E402

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

if os.environ.get("TRITON_INTERPRET") == "1":
    try:
        from tests._triton import skip_device_call_repatch, skip_unasserted_overflow_checks
        skip_device_call_repatch()  # helpers called inside a kernel skip patching triton.language again
        skip_unasserted_overflow_checks()  # no int32 overflow checks built only to be dropped
    except ImportError:  # no triton: its tests skip
        pass


def pytest_collection_modifyitems(items):
    """Tests marked `long` first (stable otherwise): with `-n 2 --dist worksteal` a worker starts
    the proof-of-learning run at once instead of last."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


@pytest.fixture
def graphs_on_cpu(monkeypatch):
    """Captures run on CPU through `EagerGraph` (tests/_graphs.py): the capture paths' composition."""
    from tests._graphs import EagerGraph
    from worldmodels.core import cuda_graphs
    monkeypatch.setattr(cuda_graphs, "captures_graphs", lambda tensor: True)
    monkeypatch.setattr(cuda_graphs, "GraphedUnroll", EagerGraph)
    EagerGraph.made = 0


@pytest.fixture(autouse=True)
def _restore_recurrent_settings():
    """Afterwards clear the context-local backend / mode set in this thread and the process-global
    recurrent precision, and restore torch's float32 matmul precision."""
    torch_precision = torch.get_float32_matmul_precision()
    yield
    set_recurrent_backend(None)
    set_recurrent_mode(None)
    set_recurrent_matmul_precision(None)
    torch.set_float32_matmul_precision(torch_precision)


@pytest.fixture
def every_torch_warning():
    """torch's C++ warnings that fire once per process (TORCH_WARN_ONCE, e.g. rms_norm's "Cannot
    dispatch to fused implementation") fire on every call: a test that checks for one, or for its
    absence, does not depend on whether an earlier test in the same process triggered it."""
    before = torch.is_warn_always_enabled()
    torch.set_warn_always(True)
    yield
    torch.set_warn_always(before)
