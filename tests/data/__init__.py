"""Tests of worldmodels/data."""
