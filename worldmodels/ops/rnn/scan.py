"""GRU / LSTM sequences on torch's scan: the reference math (reference.py) with the time loop
traced once, so `torch.compile(fullgraph=True)` has no graph break and its compile time does not
grow with T. Scan-specific guards live in the driver (`core/unroll.py: scan_unroll`)."""

from __future__ import annotations

import functools

from worldmodels.core.unroll import scan_unroll
from worldmodels.ops.rnn.reference import unrolled_rnn

rnn = functools.partial(unrolled_rnn, scan_unroll)
