"""`rag related PATH#Lx-Ly`: the chunks most similar to a location (or a chunk id), as a ContextPack.

No query is embedded: the location's own stored vectors are read back (`Store.vectors`) and the
store is searched by them, under the same filters and allow-list as a search (`scopes`). The
location's chunks, and every chunk of the same file overlapping its lines, are left out: an agent
asking "what is like this code" already has it. The anchor itself must lie inside the caller's
tenant, repository and token scope, so a location outside them is as unknown as a missing one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..contracts import ContextPack, Filters, RetrievalQuery, Usage
from ..embedding import Embedder
from ..errors import MoonmindError
from ..ids import telemetry_id, utc_timestamp
from ..settings import Settings
from ..store import Hit, Match, SearchSpec, Store, Where
from ..store.guardrails import check_collection
from ..store.scopes import Scope, canonical_query
from .budgets import Deadline, fit_tokens
from .context_pack import format_context_text, item_from_payload

#: `path#L10-L20`, `path#L10`, or a chunk id `path#3` (what a pack's `chunk_id` holds); a bare path is the whole file.
_LOCATION = re.compile(r"^(?P<path>.+?)(?:#(?:L(?P<a>\d+)(?:-L?(?P<b>\d+))?|(?P<seq>\d+)))?$")
_ANCHOR_FIELDS = ("path", "repo", "tenant", "chunk_sequence", "line_start", "line_end")
_HIT_FIELDS = ("path", "repo", "tenant", "line_start", "line_end")


@dataclass(frozen=True)
class Location:
    path: str
    first: int | None = None  # 1-based lines, inclusive; None = the whole file
    last: int | None = None
    sequence: int | None = None  # a chunk id's sequence number

    def describe(self) -> str:
        if self.sequence is not None:
            return f"{self.path}#{self.sequence}"
        if self.first is None:
            return self.path
        return f"{self.path}#L{self.first}-L{self.last}"


def parse_location(text: str) -> Location:
    """`text` as a location; invalid_argument when it is not one (the remedy shows the forms)."""
    m = _LOCATION.match(text.strip())
    path = m.group("path").strip() if m else ""
    while path.startswith("./"):
        path = path[2:]
    if not m or not path or path.startswith("/") or "#" in path:
        raise MoonmindError(
            "invalid_argument", f"{text!r} is not a location.",
            "Pass a repository-relative path as `rag search` cites it: auth/tokens.py#L10-L40, auth/tokens.py#L12, "
            "a chunk id (auth/tokens.py#3) or a whole file (auth/tokens.py).",
        )
    if m.group("seq") is not None:
        return Location(path, sequence=int(m.group("seq")))
    if m.group("a") is None:
        return Location(path)
    first = int(m.group("a"))
    last = int(m.group("b")) if m.group("b") is not None else first
    if first < 1 or last < first:
        raise MoonmindError("invalid_argument", f"Lines L{first}-L{last} of {text!r} are not a range.",
                            "Lines count from 1 and the range goes forward, e.g. auth/tokens.py#L10-L40.")
    return Location(path, first, last)


def _anchor(loc: Location, query: RetrievalQuery, scope: Scope | None, store: Store) -> tuple[list[Hit], list[Hit]]:
    """(the location's chunks, the same file's chunks that overlap them), inside the caller's scope."""
    # the anchor obeys tenant, repository and the allow-list; every other filter narrows the results only
    unnarrowed = query.model_copy(update={"filters": Filters(repo=query.filters.repo, tenant=query.filters.tenant)})
    where = canonical_query(unnarrowed, scope)
    chunks = list(store.scroll(Where(must=(*where.must, Match("path", loc.path))), list(_ANCHOR_FIELDS)))
    if not chunks:
        raise MoonmindError(
            "not_found", f"No indexed chunk at {loc.path} within these filters ({_scope_text(query)}).",
            "Pass the path as `rag search` cites it (relative to the repository root), check --repo/--filters, "
            "or index the repository: moonmind rag index PATH --repo NAME.",
        )
    repos = sorted({(h.payload.get("repo", ""), h.payload.get("tenant", "")) for h in chunks})
    if len(repos) > 1:
        names = ", ".join(f"{r} (tenant {t})" for r, t in repos)
        raise MoonmindError("invalid_argument", f"{loc.path} is indexed in several repositories: {names}.",
                            "Name one: --repo NAME (or --filters repo=NAME tenant=NAME).")
    if loc.sequence is not None:
        chosen = [h for h in chunks if h.payload.get("chunk_sequence") == loc.sequence]
    elif loc.first is not None:
        chosen = [h for h in chunks if h.payload["line_start"] <= (loc.last or loc.first) and h.payload["line_end"] >= loc.first]
    else:
        chosen = chunks
    if not chosen:
        lines = max(h.payload["line_end"] for h in chunks)
        raise MoonmindError(
            "not_found", f"{loc.describe()} names no indexed chunk: {loc.path} has {len(chunks)} chunks, lines L1-L{lines}.",
            f"Pass lines within L1-L{lines}, or a chunk id {loc.path}#0 to #{len(chunks) - 1}.",
        )
    lo = min(h.payload["line_start"] for h in chosen)
    hi = max(h.payload["line_end"] for h in chosen)
    overlapping = [h for h in chunks if h.payload["line_start"] <= hi and h.payload["line_end"] >= lo]
    return chosen, overlapping


def _scope_text(query: RetrievalQuery) -> str:
    scoped = query.filters.scope()
    return ", ".join(f"{k}={v}" for k, v in scoped.items() if k in ("repo", "tenant")) or "no repo or tenant filter"


def _mean_direction(vectors: list[list[float]]) -> list[float]:
    """The normalised mean of the anchor's vectors: one query for a location that spans several chunks."""
    dims = len(vectors[0])
    mean = [sum(v[i] for v in vectors) / len(vectors) for i in range(dims)]
    norm = sum(x * x for x in mean) ** 0.5 or 1.0
    return [x / norm for x in mean]


def related_pack(
    query: RetrievalQuery, *, settings: Settings, embedder: Embedder, store: Store, scope: Scope | None = None,
    started: float | None = None,
) -> ContextPack:
    """The pack of chunks most similar to the location in `query.query`, best first, the location itself left out."""
    import numpy as np

    budgets = query.budgets
    deadline = Deadline(budgets.latency_ms if budgets else None, started)
    loc = parse_location(query.query)
    top_k = query.top_k or settings.top_k
    check_collection(store, embedder)  # the stored vectors must be this model's, as a search's are
    chosen, overlapping = _anchor(loc, query, scope, store)
    stored = store.vectors([h.id for h in chosen])
    if not stored:
        raise MoonmindError("not_found", f"{loc.describe()} was removed while it was read.", "Run it again.")
    direction = np.asarray(_mean_direction(list(stored.values())), dtype=np.float32)
    deadline.check("reading the location's vectors")
    skip = {h.id for h in overlapping}
    spec = SearchSpec(where=canonical_query(query, scope), limit=top_k + len(skip), dense=direction, fields=_HIT_FIELDS)
    hits = [h for h in store.search([spec])[0] if h.id not in skip]
    deadline.check("searching Qdrant")
    threshold = query.score_threshold if query.score_threshold is not None else 0.0
    best = max((h.score for h in hits), default=None)
    kept = [h for h in hits if h.score >= threshold][:top_k]
    full = {h.id: h.payload for h in store.retrieve([h.id for h in kept])}
    # cosine similarity in [-1, 1]; a pack's scores are in [0, 1]
    items = [item_from_payload(full[h.id], min(max(h.score, 0.0), 1.0)) for h in kept if h.id in full]
    anchor = chosen[0].payload
    notes = [f"related to {loc.describe()} (repo {anchor.get('repo')}): its {len(skip)} chunk(s) of that file "
             f"overlapping L{min(h.payload['line_start'] for h in chosen)}-L{max(h.payload['line_end'] for h in chosen)} "
             "are left out"]
    items, truncated = fit_tokens(items, budgets, deadline, notes)
    if not items:
        notes.append("no other chunk matches these filters" if best is None
                     else f"no chunk scored >= {threshold:.2f}; the best was {best:.3f}")
    return ContextPack(
        context_text=format_context_text(items),
        items=items,
        filters=query.filters.scope(),
        budgets=budgets,
        usage=Usage(tokens=sum(i.token_count for i in items), latency_ms=deadline.elapsed_ms()),
        transport=query.transport,
        retrieved_at=utc_timestamp(),
        telemetry_id=telemetry_id(),
        query=loc.describe(),
        top_k=top_k,
        score_threshold=float(threshold),
        best_score=None if best is None else round(float(best), 6),
        truncated=truncated,
        notes=notes,
    )
