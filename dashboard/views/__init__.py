"""Dashboard pages (pages.py), chart endpoints (endpoints.py) and team-review actions (review.py)."""
