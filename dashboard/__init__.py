"""Plotly stability dashboards: pure figure builders and data helpers, and (later) views.

Importing this package loads no Django model; figure builders and data helpers
(downsample, survival, aggregate, stability, figures, export) work without
Django settings.
"""
