"""Experiments and sweeps: what a team wants to compare."""
