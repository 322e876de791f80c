"""REST API (Django REST Framework), DESIGN.md 3.3."""
