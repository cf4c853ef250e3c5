"""The job lifecycle hook: sets job.capabilities.rag, runs doctor checks, emits queue events.

`bootstrap.hook` is the logic (used by `moonmind job start|finish`); `bootstrap.celery_signals`
connects it to a Celery job task's start and end.
"""
