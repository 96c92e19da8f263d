"""Tests of worldmodels/envs."""
