"""Shared fixtures: every test leaves the recurrent core's settings as it found them."""

from __future__ import annotations

import pytest
import torch

from worldmodels.core import set_recurrent_backend, set_recurrent_matmul_precision, set_recurrent_mode


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
