"""The web wing's views: the pages (run_pages.py, variant_pages.py, compare_pages.py,
stability_page.py, sharing page_common.py), chart endpoints (endpoints.py), forms,
actions and team-review actions (review.py)."""
