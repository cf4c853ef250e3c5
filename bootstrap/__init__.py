"""The job lifecycle hook: sets job.capabilities.rag, runs doctor checks, emits queue events.

An alias package kept for the design card's layout: the logic is `moonmind_worker.jobs.hook`
(used by `moonmind job start|finish`), its Celery signal handlers `moonmind_worker.celery.job_signals`;
`bootstrap.hook` and `bootstrap.celery_signals` are those very modules.
"""
