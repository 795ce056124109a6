"""Tests of the measurement scripts in scripts/: what they print and that they run."""
