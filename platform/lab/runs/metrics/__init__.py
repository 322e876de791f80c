"""The metric store: ingest rows (ingest.py), seal them into columns (seal.py,
layout in columns.py), read series (read.py) and thin them keeping extremes
(downsample.py, also used by the dashboards)."""
