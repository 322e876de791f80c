"""The web wing, in three rooms (docs/design.md 1.4):

- ``dashboard.charts``: pure chart code, series in and figure out (no Django);
- ``dashboard.review``: team review's models and services and the pages' reads
  (Django app label ``dashboard``: its tables and migrations are the first layout's);
- ``dashboard.web``: views, URLs, forms, templates and static files.

Each imports only those before it in that list.
"""
