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
from ..store import MatchAny, SearchSpec, SparseVec, Store, Where
from ..store.guardrails import check_collection
from ..store.scopes import Scope, canonical_query
from ..text import lexical
from . import ranking
from .budgets import Deadline, check_trimmed, precheck_tokens, trim_to_tokens
from .context_pack import format_context_text, item_from_payload
from .overlay_plan import plan_search

#: Candidates per branch (dense, BM25): enough for file-level evidence and diversity.
CANDIDATE_POOL = 80

#: Default threshold per embedding model, calibrated so relevant hits pass
#: (see docs/retrieval.md "Scores"); models not listed use FALLBACK_THRESHOLD.
THRESHOLDS: dict[str, float] = {
    # measured: on shared/eval/fastapi.json the best relevant item of every query scores
    # >= 0.37 and 90% of relevant items in the top 10 score >= 0.245 (BENCHMARKS.md)
    "moonmind-static-minilm-256": 0.2,
    # hosted models: scaled from their earlier calibration to the ranking formula, not re-measured
    "gemini-embedding-001": 0.36,
    "text-embedding-3-small": 0.28,
}
FALLBACK_THRESHOLD = 0.24

#: Above this many characters a query is still processed, with a note (spec 05 US3-2).
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
    """FR-005's retrieve_context_pack(query, filters, top_k, budgets): no generative model anywhere.

    `scope` is the caller's allow-list (the gateway passes the token's); `started`
    (time.monotonic) lets a server count the time since the request arrived.
    Budget rules live in `budgets` so every transport applies the same ones.
    """
    budgets = query.budgets
    deadline = Deadline(budgets.latency_ms if budgets else None, started)
    text, notes = prepare_query_text(query.query, settings.max_query_chars)
    top_k = query.top_k or settings.top_k
    precheck_tokens(text, top_k, settings.chunk_chars, budgets)
    threshold = query.score_threshold if query.score_threshold is not None else default_threshold(settings, embedder.name)

    check_collection(store, embedder)
    deadline.check("checking the collection")
    qvec = _bounded(lambda d: embedder.embed_query(text, deadline=d) if d else embedder.embed_query(text), deadline, "embedding the query")
    ids, values = lexical.query_vector(text)
    where = canonical_query(query, scope)
    pool = max(top_k * 4, CANDIDATE_POOL)
    fields = SYMBOL_CANDIDATE_FIELDS if ranking.query_symbols(text) else CANDIDATE_FIELDS
    sparse = SparseVec(ids, values) if ids else None
    specs = [SearchSpec(where=where, limit=pool, dense=qvec, fields=fields, bm25_to=sparse)]
    if ids:
        specs.append(
            SearchSpec(where=where, limit=pool, sparse=sparse, cosine_to=qvec, fields=fields)
        )
    plan = plan_search(query, specs)  # the run's live overlay joins the same batched request
    specs = specs + plan.specs
    results = _bounded(lambda d: store.search(specs, deadline=d) if d else store.search(specs), deadline, "searching Qdrant")
    results = plan.combine(results)
    ranked = ranking.score(text, ranking.merge(results[0], results[1] if ids else []))
    ranked = plan.order(ranked)  # overlay items first; shadowed canonical paths already dropped

    best_score = max((c.score for c in ranked), default=None)
    kept = [c for c in ranked if c.score >= threshold][:top_k]
    full = {h.id: h.payload for h in store.retrieve([c.id for c in kept])}
    items = [item_from_payload(full[c.id], c.score) for c in kept if c.id in full]
    truncated = False
    if budgets and budgets.tokens:
        before = items
        items, truncated = trim_to_tokens(items, budgets.tokens)
        check_trimmed(len(before), items, before[0].token_count if before else 0, budgets, deadline.elapsed_ms())
        if truncated:
            notes.append(
                f"dropped {len(before) - len(items)} lowest-ranked item(s) to fit the token budget of {budgets.tokens}"
            )
    if not items:
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
    )


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
    generic = "no chunks match these filters; check the filters (repo, tenant, run_id, path, language) or index the repository"
    if repo is None:
        return generic
    try:
        unscoped = query.model_copy(update={"filters": query.filters.model_copy(update={"repo": None, "path": None, "language": None})})
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
