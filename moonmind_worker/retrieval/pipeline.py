"""The one retrieval pipeline every entry point calls (CLI, Celery task, gateway).

validate → embed query → one batched store request (dense + BM25 branches)
→ rank (`ranking`: fuse, structure signals, file diversity; dedupe by
(path, chunk_hash)) → threshold → top_k → ContextPack.
With a run id, the run's workspace overlay rides in the same batch and is
merged ahead of canonical hits (rules in `overlay`).

Scores: each candidate's `score` is in [0, 1], a weighted sum of cosine, relative
BM25, path match, symbol definition and file support, times a path prior and a
per-file diversity discount (defined in `ranking`). Results are ordered by
score, then path, then offset, so identical input gives identical output.
"""

from __future__ import annotations

from .. import observe
from ..contracts import ContextPack, RetrievalQuery, Usage
from ..embedding import Embedder, normalize_whitespace
from ..errors import MoonmindError
from ..ids import telemetry_id, utc_timestamp
from ..settings import Settings
from ..store import MatchAny, SearchSpec, SparseVec, Store, Where, lexstats
from ..store.guardrails import check_collection
from ..store.scopes import Scope, canonical_query
from ..text import lexical
from . import paging, ranking
from .budgets import Deadline, fit_tokens, precheck_tokens
from .context_pack import format_context_text, item_from_payload
from .overlay_plan import plan_search
from .shaping import shape_items

#: Candidates per branch (dense, BM25): enough for file-level evidence and diversity.
CANDIDATE_POOL = 80

#: Default threshold per embedding model, calibrated so relevant hits pass
#: (see docs/retrieval.md "Scores"); models not listed use FALLBACK_THRESHOLD.
THRESHOLDS: dict[str, float] = {
    # below every query's best relevant item and above a nonsense query (BENCHMARKS.md, calibration)
    "moonmind-static-code-256": 0.2,
    # hosted models: scaled from their earlier calibration to the ranking formula, not re-measured
    "gemini-embedding-001": 0.36,
    "text-embedding-3-small": 0.28,
}
FALLBACK_THRESHOLD = 0.24

#: Above this many characters a query is still processed, with a note, not refused.
LONG_QUERY_CHARS = 1000


def default_threshold(settings: Settings, model: str) -> float:
    if settings.score_threshold is not None:
        return settings.score_threshold
    return THRESHOLDS.get(model, FALLBACK_THRESHOLD)


#: Payload fields candidates carry through fusion, overlay merge, dedupe and ordering;
#: the full payload (chunk text included) is fetched for the final top_k only.
CANDIDATE_FIELDS = (
    "path", "repo", "tenant", "chunk_hash", "offset_start", "trust_class", "run_id", "expires_at", "deleted", "section_title",
)
#: Symbol queries also need the chunk text, to see which candidate *defines* the symbol.
SYMBOL_CANDIDATE_FIELDS = CANDIDATE_FIELDS + ("text",)


def prepare_query_text(text: str, max_chars: int) -> tuple[str, list[str]]:
    """Whitespace-normalised query, truncated to the model limit with a note when cut."""
    notes = []
    clean = normalize_whitespace(text)
    if LONG_QUERY_CHARS < len(clean) <= max_chars:
        notes.append(
            f"long query ({len(clean)} characters): processed whole, but a focused query under "
            f"{LONG_QUERY_CHARS} characters usually retrieves better"
        )
    if len(clean) > max_chars:
        notes.append(f"query truncated from {len(clean)} to {max_chars} characters (the embedding limit)")
        clean = clean[:max_chars]
    return clean, notes


@observe.search
def retrieve_context_pack(
    query: RetrievalQuery,
    *,
    settings: Settings,
    embedder: Embedder,
    store: Store,
    scope: Scope | None = None,
    started: float | None = None,
) -> ContextPack:
    """retrieve_context_pack(query, filters, top_k, budgets): no generative model anywhere.

    `scope` is the caller's allow-list (the gateway passes the token's); `started`
    (time.monotonic) lets a server count the time since the request arrived.
    Budget rules live in `budgets` so every transport applies the same ones.
    """
    budgets = query.budgets
    deadline = Deadline(budgets.latency_ms if budgets else None, started)
    text, notes = prepare_query_text(query.query, settings.max_query_chars)
    top_k = query.top_k or settings.top_k
    page = paging.read(query)  # a bad cursor fails before any work
    shaped = query.locations_only or query.max_lines is not None
    if not shaped:  # a shaped item is smaller than a full chunk: the best one's own size is checked after retrieval
        precheck_tokens(text, top_k, settings.chunk_chars, budgets)
    threshold = query.score_threshold if query.score_threshold is not None else default_threshold(settings, embedder.name)

    info = check_collection(store, embedder)
    deadline.check("checking the collection")
    qvec = _bounded(lambda d: embedder.embed_query(text, deadline=d) if d else embedder.embed_query(text), deadline, "embedding the query")
    ids, values = lexical.query_vector(text)
    if ids and lexstats.scoped(info):  # BM25's IDF over the repositories searched, not the collection
        docs, df = lexstats.frequencies(store, info, query, scope, ids)
        values = [lexical.idf(docs, n) for n in df]
    where = canonical_query(query, scope)
    pool = page.window if page else max(top_k * 4, CANDIDATE_POOL)  # a later page ranks its first page's window
    fields = SYMBOL_CANDIDATE_FIELDS if ranking.query_symbols(text) else CANDIDATE_FIELDS
    sparse = SparseVec(ids, values) if ids else None
    asked = pool + ranking.TIE_MARGIN  # a tie at the pool's edge is cut by id (ranking.cut_ties)
    specs = [SearchSpec(where=where, limit=asked, dense=qvec, fields=fields, bm25_to=sparse)]
    if ids:
        specs.append(
            SearchSpec(where=where, limit=asked, sparse=sparse, cosine_to=qvec, fields=fields)
        )
    plan = plan_search(query, specs)  # the run's live overlay joins the same batched request
    branches = len(specs)
    specs = specs + plan.specs
    results = _bounded(lambda d: store.search(specs, deadline=d) if d else store.search(specs), deadline, "searching Qdrant")
    results = plan.combine([ranking.cut_ties(r, pool, asked) for r in results[:branches]] + results[branches:])
    ranked = ranking.score(text, ranking.merge(results[0], results[1] if ids else []))
    ranked = plan.order(ranked)  # overlay items first; shadowed canonical paths already dropped

    best_score = max((c.score for c in ranked), default=None)
    above = [c for c in ranked if c.score >= threshold]
    offset = page.offset if page else 0
    kept = above[offset:offset + top_k]
    full = {h.id: h.payload for h in store.retrieve([c.id for c in kept])}
    items = [item_from_payload(full[c.id], c.score) for c in kept if c.id in full]
    if shaped:  # before the budget, so it counts what the caller receives
        items = shape_items(items, text, max_lines=query.max_lines, locations_only=query.locations_only)
    items, truncated = fit_tokens(items, budgets, deadline, notes)
    shown = _consumed(kept, full, len(items)) if truncated else len(kept)
    next_cursor = paging.encode(query, offset + shown, pool) if offset + shown < len(above) else None
    if not items and offset and above:  # a cursor past the end of its list (the index changed since)
        notes.append(f"this page starts at result {offset + 1}, past the last of this search's {len(above)} results")
    elif not items:
        if best_score is None:
            notes.append(no_match_note(query, scope, store))
        elif not truncated:
            lower = f"{max(best_score - 0.05, 0):.2f}"
            how = (f'Send a lower "score_threshold" (e.g. {lower})' if query.transport == "gateway"  # an HTTP client
                   else f"Lower --score-threshold (e.g. --score-threshold {lower})")
            notes.append(
                f"no chunk scored >= {threshold:.2f}; the best score seen was {best_score:.3f}. {how} to see more."
            )
    context_text = format_context_text(items)
    # built, not validated: every value is this function's own, already of its field's type
    # (tests/test_contracts.py validates real packs and compares); see contracts.json_dump
    return ContextPack.model_construct(
        context_text=context_text,
        items=items,
        filters=query.filters.scope(),
        budgets=budgets,
        usage=Usage.model_construct(tokens=sum(i.token_count for i in items), latency_ms=deadline.elapsed_ms()),
        transport=query.transport,
        retrieved_at=utc_timestamp(),
        telemetry_id=telemetry_id(),
        query=text,
        top_k=top_k,
        score_threshold=float(threshold),
        best_score=None if best_score is None else round(float(best_score), 6),
        truncated=truncated,
        notes=notes,
        total_results=len(above),
        offset=offset,
        next_cursor=next_cursor,
        max_lines=query.max_lines,
        locations_only=query.locations_only,
    )


def _consumed(kept: list, full: dict, shown: int) -> int:
    """How many of the page's candidates the first `shown` items used (a chunk gone since the search counts too)."""
    used = 0
    if shown == 0:
        return 0
    for n, c in enumerate(kept, 1):
        used += c.id in full
        if used == shown:
            return n
    return len(kept)


#: At most this many repository names in a note (a store may hold many).
NOTE_REPOS = 20


def indexed_repos(store: Store, where_must: tuple, limit: int = NOTE_REPOS + 1) -> list[str]:
    """The distinct repositories among canonical chunks matching `where_must`, one cheap lookup per repository."""
    found: list[str] = []
    while len(found) < limit:
        where = Where(must=where_must, must_not=(MatchAny("repo", tuple(found)),) if found else ())
        hit = next(iter(store.scroll(where, ["repo"], batch=1)), None)
        if hit is None or not hit.payload.get("repo"):
            break
        found.append(str(hit.payload["repo"]))
    return sorted(found)


def no_match_note(query: RetrievalQuery, scope: Scope | None, store: Store) -> str:
    """Why nothing matched the filters; a repo filter naming no indexed repository lists the ones there are.

    Why: a misspelled `repo=myrpo` otherwise looks like an empty index. Only repositories the
    caller may see are named (its tenant filter and, on the gateway, its token's scope).
    """
    repo = query.filters.repo
    generic = ("no chunks match these filters; check the filters (repo, tenant, run_id, path, language, resource_type) "
               "or index the repository")
    if repo is None:
        return generic
    try:
        narrowing = {"repo": None, "path": None, "language": None, "resource_type": None}
        unscoped = query.model_copy(update={"filters": query.filters.model_copy(update=narrowing)})
        must = canonical_query(unscoped, scope).must
        repos = indexed_repos(store, must)
    except Exception:  # noqa: BLE001 - a note never fails a search
        return generic
    if repo in repos:
        return generic
    tenant = f" for tenant {query.filters.tenant!r}" if query.filters.tenant else ""
    if not repos:
        return f"no chunks match these filters: nothing is indexed{tenant} yet; run `moonmind rag index PATH --repo {repo}`"
    more = ", ..." if len(repos) > NOTE_REPOS else ""
    names = ", ".join(repos[:NOTE_REPOS]) + more
    return f"no chunks match these filters: repository {repo!r} is not indexed{tenant}; indexed repositories: {names}"


def _bounded(call, deadline: Deadline, stage: str):
    """Run an embedder/store call under the latency deadline (handed to it), then enforce it.

    A call that fails after the deadline passed failed *because* of it (its
    timeout was the remaining budget), so that is reported as the budget error.
    """
    try:
        out = call(deadline.at)
    except MoonmindError:
        if deadline.expired():
            raise deadline.exceeded(stage) from None
        raise
    deadline.check(stage)
    return out
