"""The Celery application (`celery -A tasks worker`); filled in by the Celery/bootstrap work."""
