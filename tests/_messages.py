"""Failure messages that keep torch's own: `torch.testing.assert_close(..., msg=labelled("update 0, loss"))`.

A plain string `msg` replaces assert_close's message, and with it the greatest absolute and relative
differences, which are what a failure on a machine one cannot rerun at will (the GPU) has to show.
"""

from __future__ import annotations


def labelled(label: str):
    """assert_close's message: the label, then torch's own."""
    return lambda message: f"{label}: {message}"
