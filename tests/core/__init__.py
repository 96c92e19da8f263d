"""Tests of worldmodels/core."""
