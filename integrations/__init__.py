"""Pieces that run inside other frameworks' training jobs and report to the lab through
the frameworks' own logging (docs/integrations.md). They import the trainer's
formulas at most, never Django or the lab (tests/test_import_layers.py)."""
