"""Tests of worldmodels/algos."""
