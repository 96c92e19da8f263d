"""Tests of worldmodels/models."""
