"""Plotly stability dashboards: pure figure builders and data helpers, pages and team review.

Importing this package loads no Django model; the pure modules (downsample,
survival, aggregate, stability, figures, export, charts, panels, configdiff)
work without Django settings. The Django side: models.py (verdicts, saved
comparisons, pinned baselines), services.py (writes), queries.py (reads),
views/ (pages, chart endpoints, review actions), urls.py.
"""
