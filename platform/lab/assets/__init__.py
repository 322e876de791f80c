"""Registered models and datasets: checkpoints and data files a team names once and picks in runs."""
