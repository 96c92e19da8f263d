"""Tests of worldmodels/ops."""
