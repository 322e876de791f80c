"""Benchmark scripts; results go to bench/results/ (git-ignored)."""
