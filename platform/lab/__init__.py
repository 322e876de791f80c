"""The platform's Django project: experiments, runs, the job queue, the API and the web pages.

``platform/`` is only the source folder; this package has a real name so that
``import platform`` everywhere still finds the standard library module (uuid,
Celery and kombu import it).
"""
