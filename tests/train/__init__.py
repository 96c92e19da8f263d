"""Tests of worldmodels/train, scripts/ and configs/."""
