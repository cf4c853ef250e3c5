"""The job hook as Celery signal handlers: `task_prerun` / `task_postrun` of the job task.

Import this module in the Celery app that runs jobs (`tasks` does). A job task is one
whose name is in ``MOONMIND_JOB_TASKS`` (comma-separated, default ``moonmind.job.run``)
or whose class derives from `JobTask`; its manifest is ``kwargs["manifest"]`` or the
first positional argument (a dict), updated in place so the task body sees
``job.capabilities.rag`` and ``job.rag``.

Why `JobTask`: Celery swallows exceptions raised by signal handlers, so a handler cannot
stop a task. The prerun handler records ``job.rag.blocked``; `JobTask.before_start`
(which runs inside the task's trace) fails the job with ``job_blocked`` and the remedy.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from celery import Task, signals

from moonmind_worker.errors import MoonmindError
from moonmind_worker.jobs.hook import BANNER, ENV_FIELDS, finish_job, job_of, start_job

log = logging.getLogger("moonmind.bootstrap")

DEFAULT_JOB_TASKS = "moonmind.job.run"


class JobBlocked(Exception):
    """The job requires RAG and retrieval is not available (args: code, message, action — JSON-safe)."""

    def __init__(self, code: str, message: str, action: str) -> None:
        super().__init__(code, message, action)


class JobTask(Task):
    """Base class for job tasks: refuses to run a job the start hook blocked."""

    def before_start(self, task_id: str, args: tuple, kwargs: dict) -> None:
        manifest = manifest_of(args, kwargs)
        if manifest is None:
            return
        rag = job_of(manifest).get("rag") or {}
        if rag.get("blocked"):
            raise JobBlocked(
                "job_blocked",
                f"This job requires RAG but retrieval is not available ({rag.get('reason')}).",
                rag.get("remedy") or "Run `moonmind worker doctor` and fix what it reports.",
            )


def job_task_names() -> set[str]:
    raw = os.environ.get("MOONMIND_JOB_TASKS", DEFAULT_JOB_TASKS)
    return {n.strip() for n in raw.split(",") if n.strip()}


def is_job_task(task: Any) -> bool:
    return task is not None and (isinstance(task, JobTask) or getattr(task, "name", None) in job_task_names())


def manifest_of(args: Any, kwargs: Any) -> dict | None:
    if isinstance(kwargs, dict) and isinstance(kwargs.get("manifest"), dict):
        return kwargs["manifest"]
    if args and isinstance(args[0], dict):
        return args[0]
    return None


@signals.task_prerun.connect
def on_job_start(sender=None, task_id=None, task=None, args=None, kwargs=None, **_: Any) -> None:
    if not is_job_task(task):
        return
    manifest = manifest_of(args, kwargs)
    if manifest is None:
        log.warning("job task %s[%s] has no manifest; RAG capability not resolved", getattr(task, "name", "?"), task_id)
        return
    from moonmind_worker.settings import get_settings

    _saved_environ[task_id] = {var: os.environ.get(var) for var in ENV_FIELDS.values()}
    try:
        start_job(manifest, settings=get_settings())
    except MoonmindError as err:
        log.error("job %s blocked: %s (%s)", task_id, err.message, err.action)
        return
    rag = job_of(manifest)["rag"]
    if rag["available"]:
        print(BANNER, flush=True)  # the worker's stdout is the job log
    else:
        log.warning("RAG unavailable for job %s: %s", task_id, rag["reason"])


@signals.task_postrun.connect
def on_job_end(sender=None, task_id=None, task=None, args=None, kwargs=None, state=None, **_: Any) -> None:
    if not is_job_task(task):
        return
    manifest = manifest_of(args, kwargs)
    if manifest is None:
        return
    from moonmind_worker.settings import get_settings

    outcome = {"SUCCESS": "success", "FAILURE": "failure"}.get(state or "", (state or "unknown").lower())
    try:
        finish_job(manifest, settings=get_settings(), outcome=outcome)
    finally:
        _restore_environ(task_id)


#: The job scope variables as they were before each running job task exported its own (task id → values).
_saved_environ: dict[Any, dict[str, str | None]] = {}


def _restore_environ(task_id: Any) -> None:
    """Put the worker's environment back as it was before the job: no job's identity tags later tasks' events."""
    saved = _saved_environ.pop(task_id, None)
    if saved is None:
        return
    for var, value in saved.items():
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value
