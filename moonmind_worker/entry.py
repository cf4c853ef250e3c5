"""What every entry point (the CLI, the MCP server, a worker's job) shares: one search request, scoped once.

Why a module of its own below them: the MCP server, the transports and the owner's client need the
same request building, answer checks and notes as the CLI, and importing them from `cli/` made the
layers below depend on the one above.
"""

from __future__ import annotations

import sys

from .errors import MoonmindError

TYPE_CHECKING = False  # annotations only: a one-shot CLI call imports this, and no `typing` (see cli/main.py)
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

#: Inside a job (MOONMIND_JOB_ID set by `job start`), these exported scope fields are a ceiling.
JOB_CEILING = ("tenant", "run_id")


def refuse_widening(asked: dict[str, str], settings: Any) -> None:
    """A job's tenant and run are a ceiling its CLI calls cannot widen, on every transport.

    Why: the job's environment is what the control plane scoped it to; a `--filters tenant=other`
    (a typo, or an agent told to by retrieved text) must not read another tenant's chunks or
    another run's uncommitted edits. The repository stays a default: a tenant's repositories
    are shared within it. This guards the CLI; a worker that runs untrusted code gets no direct
    store access at all and uses the gateway with a scoped token (docs/celery.md, "Trust model").
    The rule is `job_scope.within`, which every operation applies again where it runs.
    """
    from .job_scope import within

    for key in JOB_CEILING:
        within(settings, key, asked.get(key), "the filter")


def search_request(
    query: Any, *, top_k: Any = None, filters: dict[str, Any] | None = None, overlay: Any = "include",
    score_threshold: Any = None, budgets: dict[str, Any] | None = None, max_lines: Any = None,
    locations_only: Any = False, cursor: Any = None,
) -> dict[str, Any]:
    """RetrievalQuery fields from a caller's values (the CLI's flags, an MCP tool's arguments), not yet validated.

    Why one function: every entry point scopes a search the same way, to the job's
    MOONMIND_REPO, MOONMIND_TENANT and MOONMIND_RUN_ID when set, which the caller's own
    filters override. With no tenant set a search sees every tenant the caller may read,
    so it finds what `rag index` and `rag overlay upsert` wrote under `default`.
    """
    from .settings import get_settings

    settings = get_settings()
    scoped: dict[str, Any] = {}
    for key, value in (("repo", settings.repo), ("tenant", settings.tenant), ("run_id", settings.run_id)):
        if value:
            scoped[key] = value
    if settings.job_id:
        refuse_widening(filters or {}, settings)
    scoped.update(filters or {})
    data: dict[str, Any] = {
        "query": query,
        "top_k": top_k,
        "filters": scoped,
        "overlay_policy": overlay,
        "score_threshold": score_threshold,
    }
    if budgets:
        data["budgets"] = dict(budgets)
    # only when asked: a request without them is the request it was before they existed
    if max_lines is not None:
        data["max_lines"] = max_lines
    if locations_only:
        data["locations_only"] = locations_only
    if cursor is not None:
        data["cursor"] = cursor
    return data


def expect_keys(data: Any, keys: tuple[str, ...], what: str) -> dict[str, Any]:
    """`data` if it is a dict with `keys`: the cheap CLI/worker version check (the worker validated the contract)."""
    if not isinstance(data, dict) or any(k not in data for k in keys):
        raise MoonmindError(
            "internal_error", f"The worker returned something that is not {what}.",
            "Check that the worker runs the same moonmind-worker version as this CLI.",
        )
    return data


def default_root(start: Path | None = None) -> Path:
    """The enclosing git work tree (paths are stored relative to it, like the index), else the current directory."""
    from pathlib import Path

    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / ".git").exists():
            return d
    return here


def symbol_line(s: dict[str, Any]) -> str:
    """citation  kind  name  signature: one place per line, best first."""
    guess = " (guessed)" if s.get("guessed") else ""
    return f"{s['citation']}  {s['kind']}{guess}  {s['name']}  {s['signature']}".rstrip()


def note(message: str) -> None:
    """Progress notes and hints go to stderr, never mixed into stdout output."""
    from .text.terminal import printable

    sys.stderr.write(printable(f"note: {message}\n"))


def version() -> str:
    """The installed distribution's version (read only for --version: importlib.metadata is slow to import)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("moonmind-worker")
    except PackageNotFoundError:
        return "unknown (not installed)"
