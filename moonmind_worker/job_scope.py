"""The job's scope is a ceiling: inside a job, no operation reads or writes another tenant's or run's data.

Why one module: every entry point (a one-shot command, an owner serving a client, a Celery
task, an MCP tool) must give the same answer to "may this request name that tenant or run?".
A job is a process whose MOONMIND_JOB_ID is set (`job start` and the Celery job hook export
it with MOONMIND_TENANT and MOONMIND_RUN_ID); outside one, those variables are defaults a
flag may override. The repository is not a bound: a tenant's repositories are shared within
it, so a job may search, list or index another repository of its own tenant.

Standard library only: the thin queue client (`--execution queue`) imports it.
"""

from __future__ import annotations

from .errors import MoonmindError

TYPE_CHECKING = False  # annotations only: the thin client's path imports no `typing` (see cli/main.py)
if TYPE_CHECKING:
    from typing import Any

#: The scope fields that bound a job.
CEILING = ("tenant", "run_id")

#: Per operation: the arguments the ceiling bounds, and how a refusal names what was asked.
OPERATIONS: dict[str, tuple[tuple[str, ...], str]] = {
    "index": (("tenant",), "indexing into"),
    "overlay_upsert": (("tenant", "run_id"), "an overlay upsert into"),
    "overlay_clean": (("run_id",), "cleaning the overlay of"),
    "overlay_list": (("run_id",), "listing the overlay of"),
    "stats": (("tenant",), "stats for"),
    "repos": (("tenant",), "listing the repositories of"),
}


#: Operations that take a RetrievalQuery (`query`, with its filters): the ceiling fills and bounds its filters.
QUERY_OPERATIONS = ("search", "related", "symbols")


def bound(scope: Any, key: str) -> str | None:
    """The job's value of `key` when it is a ceiling (inside a job, and set), else None."""
    if not getattr(scope, "job_id", None):
        return None
    return getattr(scope, key, None) or None


def bounds(scope: Any) -> dict[str, str]:
    """The ceiling fields `scope` fixes: {} outside a job."""
    return {key: value for key in CEILING if (value := bound(scope, key)) is not None}


def within(scope: Any, key: str, wanted: Any, what: str = "the request") -> Any:
    """The effective `key` of an operation: `wanted`, capped by the job's scope.

    Outside a job, or for a field the job does not set, `wanted` comes back as given. Inside,
    nothing asked means the job's own value, the job's own value passes (restating is fine),
    and anything else is `forbidden`.
    """
    mine = bound(scope, key)
    if mine is None:
        return wanted
    value = wanted.strip() if isinstance(wanted, str) else wanted
    if value is None or value == "":
        return mine
    if value != mine:
        raise MoonmindError(
            "forbidden",
            f"This job is scoped to {key} {mine!r}; {what} {key}={value!r} would widen it.",
            f"Drop the {key} (the job's own is used): a job cannot read or write another {key}'s data.",
        )
    return mine


def confine(op: str, args: Any, scope: Any) -> Any:
    """`args` of operation `op` (owner/ops.py) with the job's tenant and run filled in; `forbidden` if they name another."""
    if not bounds(scope) or not isinstance(args, dict):
        return args  # outside a job; or not arguments at all, which the operation itself rejects
    if op == "enqueue":  # a queued task (`--execution queue`), sent from here or by the box's owner for its client
        kwargs, task = args.get("kwargs"), args.get("task")
        return {**args, "kwargs": task_kwargs(task, kwargs, scope)} if isinstance(kwargs, dict) else args
    if op in QUERY_OPERATIONS:
        query = args.get("query")
        filters = query.get("filters") if isinstance(query, dict) else None
        if not isinstance(query, dict) or not isinstance(filters, (dict, type(None))):
            return args  # the contract rejects it where it runs
        filters = dict(filters or {})
        for key in CEILING:
            value = within(scope, key, filters.get(key), "the filter")
            # a search naming no run reads no overlay at all, so only the tenant must be filled in
            if value is not None and (key == "tenant" or key in filters):
                filters[key] = value
        return {**args, "query": {**query, "filters": filters}}
    keys, what = OPERATIONS.get(op, ((), ""))
    if op == "overlay_clean" and args.get("expired") and not args.get("run_id"):
        return args  # the TTL sweep removes only expired points, which no search sees
    out = dict(args)
    for key in keys:
        value = within(scope, key, args.get(key), what)
        if value is not None:
            out[key] = value
    return out


def carried(settings: Any) -> dict[str, Any] | None:
    """The job's scope as a task carries it to a worker (whose own settings belong to no job); None outside a job."""
    if not getattr(settings, "job_id", None):
        return None
    # the repo is no bound; it travels so the worker's events name the job's repository
    return {"job_id": settings.job_id, "repo": getattr(settings, "repo", None),
            **{key: getattr(settings, key, None) for key in CEILING}}


class JobScope:
    """A job's scope carried in a task's arguments (`carried`), read back on the worker."""

    def __init__(self, job_id: str | None, tenant: str | None = None, run_id: str | None = None,
                 repo: str | None = None) -> None:
        self.job_id, self.tenant, self.run_id, self.repo = job_id, tenant, run_id, repo

    @classmethod
    def from_wire(cls, raw: Any) -> JobScope:
        fields = ("job_id", "repo", *CEILING)
        if not isinstance(raw, dict) or not all(raw.get(k) is None or isinstance(raw.get(k), str) for k in fields):
            raise MoonmindError("invalid_argument", "The task carries a job scope it does not understand.",
                                "Use the same moonmind-worker version for the CLI and the worker.")
        return cls(raw.get("job_id"), raw.get("tenant"), raw.get("run_id"), raw.get("repo"))

    def event_scope(self) -> dict[str, str | None]:
        """What the worker's events for this task carry: the job's identity, not the worker's environment."""
        return {"job_id": self.job_id, "run_id": self.run_id, "repo": self.repo, "tenant": self.tenant}


def task_kwargs(task: Any, kwargs: dict[str, Any], scope: Any) -> dict[str, Any]:
    """A queued task's kwargs sent from inside a job: confined here, and carrying the scope so the worker confines again."""
    wire = carried(scope)
    if wire is None:
        return kwargs
    from . import task_names as q

    if task == q.SEARCH:
        return {**kwargs, "query": confine("search", {"query": kwargs.get("query")}, scope)["query"], "scope": wire}
    op = {q.INDEX: "index", q.OVERLAY_UPSERT: "overlay_upsert", q.OVERLAY_CLEAN: "overlay_clean"}.get(task)
    if op is None:
        return kwargs
    return {**kwargs, "request": confine(op, kwargs.get("request"), scope), "scope": wire}
