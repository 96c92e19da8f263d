"""The RSSM unrolls on torch's scan: the reference math with the time loop traced once (no graph
break under `torch.compile(fullgraph=True)`, compile time flat in T). Scan-specific guards and the
upstream workarounds are in the driver (`core/unroll.py: scan_unroll`, `core/torch_fixes.py`)."""

from __future__ import annotations

import functools

from worldmodels.core.unroll import scan_unroll
from worldmodels.ops.rssm.reference import unrolled_imagine, unrolled_observe

observe = functools.partial(unrolled_observe, scan_unroll)
imagine = functools.partial(unrolled_imagine, scan_unroll)
