"""The Celery application: `celery -A tasks worker` (and `celery -A tasks beat`, or `-B` on one box).

`tasks.app` is configured from moonmind_worker's settings; importing this package
registers the RAG tasks (stable names in `moonmind_worker.queue_client`).
"""

import bootstrap.celery_signals  # noqa: F401 - the job hook (task_prerun/postrun)

from . import rag  # noqa: F401 - registers the tasks
from .celeryapp import app

__all__ = ["app"]
