"""The job queue: Celery task, run supervisor, metrics ingestion, reconciler."""
