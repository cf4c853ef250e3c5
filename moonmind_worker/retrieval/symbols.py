"""`rag symbols NAME`: where a name is defined, from the definitions the chunker recorded (tree-sitter).

Two store requests, no embedding: an exact lookup of the name on the indexed `symbols` payload
field (every chunk defining it, qualified `Router.handle` or short `handle`, any case), and a
BM25 search for the name, which finds partial matches (`handle_request`) and the chunks that
merely mention it. Ranked: the exact name first, then qualified or case-different names, then
partial ones, then mentions. Chunks indexed before symbol metadata (no `definitions` field) still
answer: a definition is read from their title and text (`ranking.defines_in_text`), marked
`guessed`, with a note saying how to get the real kinds and signatures.
"""

from __future__ import annotations

import re
import time
from typing import Any

from ..contracts import RetrievalQuery, SymbolHit, SymbolsResult, json_dump
from ..errors import MoonmindError
from ..settings import Settings
from ..store import Hit, MatchAny, SearchSpec, SparseVec, Store, Where
from ..store.scopes import Scope, canonical_query
from ..text import lexical
from .ranking import defines_in_text

#: Chunks read from the exact lookup at most (a name defined in more places than this is not one symbol).
MAX_DEFINING_CHUNKS = 1000
#: BM25 candidates for partial matches and mentions, at least.
MENTION_POOL = 40
_FIELDS = ("path", "repo", "tenant", "chunk_id", "line_start", "line_end", "definitions", "section_title")
_TIERS = {"exact": 1.0, "qualified": 0.8, "partial": 0.6, "mention": 0.4}
_SEP = re.compile(r"\.|::")


def _last(name: str) -> str:
    return _SEP.split(name)[-1]


def _tier(defined: str, asked: str) -> str | None:
    """How a defined (qualified) name matches the asked one; None when it does not."""
    if defined == asked:
        return "exact"
    low, want = defined.lower(), asked.lower()
    bare = _last(want) == want
    if low == want or low.endswith(("." + want, "::" + want)):  # another case, or a member of the name asked
        return "qualified"
    # `EdgeStore.search` asked, `Worker.search` defined: the same member name, another owner
    if (not bare and _last(low) == _last(want)) or _last(want) in _last(low):
        return "partial"
    return None


def _hit(payload: dict[str, Any], *, name: str, kind: str, match: str, first: int, last: int, signature: str,
         score: float, guessed: bool = False) -> SymbolHit:
    path = payload["path"]
    return SymbolHit.model_construct(
        name=name, kind=kind, match=match, path=path, repo=payload.get("repo", ""), tenant=payload.get("tenant", ""),
        line_start=first, line_end=last, signature=signature, citation=f"{path}#L{first}-L{last}",
        chunk_id=payload.get("chunk_id", ""), score=round(score, 6), guessed=guessed,
    )


def _recorded(payload: dict[str, Any], asked: str) -> list[SymbolHit]:
    """The chunk's recorded definitions that match `asked`."""
    out = []
    for d in payload.get("definitions") or ():
        tier = _tier(str(d.get("name", "")), asked)
        if tier is not None:
            bonus = 0.05 if _last(str(d["name"])) == _last(asked) else 0.0  # the case as asked ranks first
            out.append(_hit(payload, name=d["name"], kind=d.get("kind", "definition"), match=tier,
                            first=int(d["line_start"]), last=int(d["line_end"]), signature=d.get("signature", ""),
                            score=_TIERS[tier] + bonus))
    return out


def _line_of(text: str, wanted) -> tuple[int, str] | None:
    for n, line in enumerate(text.splitlines()):
        if wanted(line):
            return n, line.strip()[:200]
    return None


def _guessed(payload: dict[str, Any], asked: str) -> list[SymbolHit]:
    """An older chunk (no recorded definitions): a definition of the name read from its title and text."""
    title = payload.get("section_title") or ""
    entries = [e.strip() for e in title.split(": ", 1)[-1].split(", ") if e.strip()]
    scope = title.split(": ", 1)[0] if ": " in title else ""
    text = payload.get("text") or ""
    out = []
    for entry in entries:
        qualified = f"{scope}.{entry}" if scope and not entry.startswith(scope) else entry
        tier = _tier(qualified, asked)
        if tier is None:
            continue
        short = _last(entry)
        found = _line_of(text, lambda line, s=short: defines_in_text(line, s))
        n, signature = found if found else (0, "")
        line = payload["line_start"] + n
        out.append(_hit(payload, name=qualified, kind="definition", match=tier, first=line,
                        last=payload["line_end"] if not found else line, signature=signature,
                        score=_TIERS[tier], guessed=True))
    return out


def _mention(payload: dict[str, Any], asked: str, text: str, strength: float) -> SymbolHit | None:
    """The chunk's first line naming `asked` as a whole word (as written, else in any case); None when none does."""
    word = re.compile(rf"(?<![\w$]){re.escape(_last(asked))}(?![\w$])")
    loose = re.compile(word.pattern, re.IGNORECASE)
    found = _line_of(text, lambda line: bool(word.search(line))) or _line_of(text, lambda line: bool(loose.search(line)))
    if found is None:
        return None
    n, line_text = found
    line = payload["line_start"] + n
    return _hit(payload, name=asked, kind="mention", match="mention", first=line, last=line, signature=line_text,
                score=_TIERS["mention"] * strength)


def _once(mentions: list[SymbolHit], defined: set[tuple[str, str, str, int]]) -> list[SymbolHit]:
    """One mention a line of a repository's file, best first: chunks overlap by a few lines, and a definition's
    line needs no mention beside it."""
    once: dict[tuple[str, str, str, int], SymbolHit] = {}
    for m in mentions:
        place = (m.repo, m.tenant, m.path, m.line_start)
        if place not in defined and (place not in once or m.score > once[place].score):
            once[place] = m
    return sorted(once.values(), key=lambda s: (-s.score, s.path, s.line_start))


def find_symbols(query: RetrievalQuery, *, settings: Settings, store: Store, scope: Scope | None = None,
                 started: float | None = None) -> dict[str, Any]:
    """SymbolsResult JSON for the name in `query.query`; not_found when nothing defines or mentions it."""
    began = time.monotonic() if started is None else started
    asked = query.query.strip()
    top_k = query.top_k or settings.top_k
    if store.info() is None:
        raise MoonmindError("collection_missing", f"Collection {store.collection} does not exist yet.",
                            "Run `moonmind rag index PATH --repo NAME` to create and fill it.")
    where = canonical_query(query, scope)
    keys = tuple(sorted({asked.lower(), _last(asked.lower())}))
    found: dict[tuple[str, str, int], SymbolHit] = {}
    seen: set[str] = set()
    defining = Where(must=(*where.must, MatchAny("symbols", keys)), must_not=where.must_not)
    for n, h in enumerate(store.scroll(defining, list(_FIELDS), batch=256)):
        if n >= MAX_DEFINING_CHUNKS:
            break
        seen.add(h.id)
        for s in _recorded(h.payload, asked):
            found.setdefault((s.path, s.name, s.line_start), s)
    ids, values = _name_vector(asked)
    mentions: list[SymbolHit] = []
    legacy = 0
    if ids:
        spec = SearchSpec(where=where, limit=max(top_k * 4, MENTION_POOL), sparse=SparseVec(ids, values),
                          fields=(*_FIELDS, "text"))
        hits: list[Hit] = store.search([spec])[0]
        best = max((h.score for h in hits), default=0.0) or 1.0
        for h in hits:
            if h.id in seen:
                continue
            recorded = "definitions" in h.payload
            legacy += not recorded
            defs = _recorded(h.payload, asked) if recorded else _guessed(h.payload, asked)
            for s in defs:
                found.setdefault((s.path, s.name, s.line_start), s)
            if not defs:
                m = _mention(h.payload, asked, h.payload.get("text") or "", h.score / best)
                if m is not None:
                    mentions.append(m)
    ranked = sorted(found.values(), key=lambda s: (-s.score, s.path, s.line_start, s.name))
    ranked += _once(mentions, {(s.repo, s.tenant, s.path, s.line_start) for s in ranked})
    notes = []
    if legacy:
        notes.append(f"{legacy} chunk(s) searched were indexed before symbol metadata: their definitions are read "
                     "from the chunk text (kind \"definition\", guessed: true); run `moonmind rag index PATH --repo NAME` "
                     "again to record kinds and signatures")
    if not ranked:
        raise MoonmindError(
            "not_found", f"Nothing defines or mentions {asked!r} within these filters ({_filters_text(query)}).",
            'Check the spelling, drop a filter, or search by meaning: moonmind rag search "what it does".',
        )
    if len(ranked) > top_k:
        notes.append(f"{len(ranked)} places found; the best {top_k} shown (raise --top-k for more)")
    result = SymbolsResult.model_construct(
        query=asked, symbols=ranked[:top_k], filters=query.filters.scope(), transport=query.transport, top_k=top_k,
        latency_ms=round((time.monotonic() - began) * 1000, 2), notes=notes,
    )
    return json_dump(result)


def _name_vector(name: str) -> tuple[list[int], list[float]]:
    """BM25 query terms for a name: each identifier whole (`verify_token`) weighs 1, its parts (`verify`, `token`) 0.1.

    Why not `lexical.query_vector`'s equal weights: in a large repository the chunks that say `token`
    most would crowd out the few that name `verify_token`, which are the mentions asked for.
    """
    weights: dict[int, float] = {}
    for tok in re.findall(r"[A-Za-z0-9_]+", name):
        for n, term in enumerate(lexical.terms(tok)):
            tid = lexical.term_id(term)
            weights[tid] = max(weights.get(tid, 0.0), 1.0 if n == 0 else 0.1)
    ids = sorted(weights)
    return ids, [weights[i] for i in ids]


def _filters_text(query: RetrievalQuery) -> str:
    return ", ".join(f"{k}={v}" for k, v in query.filters.scope().items()) or "no filters"

