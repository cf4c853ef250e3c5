"""The Celery application: `celery -A moonmind_worker.celery worker` (and `beat`, or `-B` on one box).

The canonical, namespaced path, and the only one installed: a user's own `tasks.py` cannot shadow it.
A checkout's top-level `tasks` package (`celery -A tasks worker` run from the checkout) is an alias of it.

`app` is configured from moonmind_worker's settings; importing this package registers the RAG
tasks (stable names in `moonmind_worker.transports.queue_client`) and the job hook's signal handlers.
"""

from . import (
    job_signals,  # noqa: F401 - the job hook (task_prerun/postrun)
    tasks,  # noqa: F401 - registers the tasks
)
from .worker import app

__all__ = ["app"]
