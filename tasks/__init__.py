"""`celery -A tasks worker`: the design card's entry point, an alias of `moonmind_worker.celery`.

`tasks.app` is `moonmind_worker.celery.app`; `tasks.celeryapp` and `tasks.rag` are the very
module objects `moonmind_worker.celery.worker` and `.tasks` (not copies), so the app, its
configuration and its signal handlers exist once however they are imported.
"""

from moonmind_worker.celery import app

__all__ = ["app"]
