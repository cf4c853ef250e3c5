"""Every scope filter, in one place: which chunks an index run, an overlay or a search may touch.

Why one module: a scope is a security boundary (a gateway token's allow-list, a job's tenant
and run). Built in one place, it cannot mean one thing to the writer and another to the reader.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..contracts import CANONICAL, WORKSPACE_OVERLAY, RetrievalQuery
from .base import Match, MatchAny, Range, Where


@dataclass(frozen=True)
class Scope:
    """A server-side allow-list (the gateway's token scope): chunks outside it are never searched.

    A chunk is in scope when its repo is one of `repos` AND its tenant one of
    `tenants`. Client filters are applied on top, so they can only narrow it.
    """

    repos: tuple[str, ...]
    tenants: tuple[str, ...]


def canonical_repo(repo: str, tenant: str | None = None) -> Where:
    """A repository's canonical chunks (what `rag index` owns), in one tenant or all of them."""
    must: tuple[Any, ...] = (Match("repo", repo), Match("trust_class", CANONICAL))
    return Where(must=(Match("tenant", tenant), *must) if tenant else must)


def run_overlay(run_id: str, *, tenant: str | None = None, repo: str | None = None) -> list[Any]:
    """The conditions for one run's overlay, narrowed to a tenant and repo when given."""
    must: list[Any] = [Match("trust_class", WORKSPACE_OVERLAY), Match("run_id", run_id)]
    if tenant:
        must.append(Match("tenant", tenant))
    if repo:
        must.append(Match("repo", repo))
    return must


def every_overlay(*, tenant: str | None = None, repo: str | None = None) -> list[Any]:
    """The conditions for every run's overlay (the TTL sweep, `overlay list`), narrowed when given."""
    must: list[Any] = [Match("trust_class", WORKSPACE_OVERLAY)]
    must += [Match(k, v) for k, v in (("tenant", tenant), ("repo", repo)) if v]
    return must


def query_conditions(query: RetrievalQuery, scope: Scope | None = None) -> list[Any]:
    """The store conditions for the request's filters plus the allow-list (shared by every branch)."""
    f = query.filters
    must: list[Any] = []
    for key in ("tenant", "repo", "path", "language"):
        value = getattr(f, key)
        if value is not None:
            must.append(Match(key, value))
    if f.resource_type is not None:  # derived from the stored language, so indexes of any age answer it
        from ..text.kinds import LANGUAGES_OF

        must.append(MatchAny("language", LANGUAGES_OF[f.resource_type]))
    if scope is not None:
        must.append(MatchAny("tenant", tuple(scope.tenants)))
        must.append(MatchAny("repo", tuple(scope.repos)))
    return must


def canonical_query(query: RetrievalQuery, scope: Scope | None = None) -> Where:
    """The canonical branch of a search: the request's filters inside the allow-list."""
    return Where(must=(Match("trust_class", CANONICAL), *query_conditions(query, scope)))


def overlay_query(where: Where, run_id: str, now: float, *extra: Any) -> Where:
    """The canonical branch's filter turned into "this run's live overlay".

    Every scope condition the caller built (filters, a gateway allow-list) is
    kept; only the trust-class condition is swapped, and the run id and the
    expiry Range are added, so an overlay branch can never be wider than the
    canonical one it mirrors.
    """
    keep = tuple(c for c in where.must if getattr(c, "key", None) not in ("trust_class", "run_id", "expires_at"))
    must = (*keep, Match("trust_class", WORKSPACE_OVERLAY), Match("run_id", run_id), Range("expires_at", gt=now), *extra)
    return Where(must=must, must_not=where.must_not, should=where.should)
