"""REST API (Django REST Framework): endpoints in docs/platform.md, contracts in
docs/design.md."""
