"""Runs, their metrics and comments: the state of record of every training run."""
