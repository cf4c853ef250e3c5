"""The wire contracts (field names are binding: clients parse them; docs/operations.md "Contracts").

The query, the pack, the errors, the gateway's and `rag symbols`' shapes are here; the Celery tasks'
arguments and reports are in `task_contracts.py`, the models' base in `contract_base.py`, and both are
re-exported, so every contract is `contracts.X`. The chunk payload schema lives here too: the indexer
writes `ChunkPayload` and the retriever reads it, so the two can never disagree about a field name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from .contract_base import Contract, json_dump  # noqa: F401 - every caller names them `contracts.X`
from .errors import has_surrogate
from .task_contracts import (  # noqa: F401 - the tasks' contracts, named `contracts.X` by their callers
    IndexReport,
    IndexRequest,
    OverlayCleanRequest,
    OverlayCleanResult,
    OverlayReport,
    OverlayUpsertRequest,
    SkippedFile,
    SweepResult,
)

#: Version of the stored chunk payload. A collection written with a version this
#: code does not list in READABLE_SCHEMA_VERSIONS is refused (re-index instead).
PAYLOAD_SCHEMA_VERSION = 1
READABLE_SCHEMA_VERSIONS = frozenset({1})

TOP_K_MIN, TOP_K_MAX = 1, 50

SHAPES_EXCLUSIVE = "locations_only and max_lines exclude each other (locations only has no lines to cut)"

#: Filter keys a caller may pass; each maps to an indexed payload field (`resource_type` to `language`: text/kinds.py).
FILTER_KEYS = ("repo", "tenant", "run_id", "path", "language", "resource_type")
#: The values of the `resource_type` filter, each a set of languages (text/kinds.py).
RESOURCE_TYPES = ("code", "docs", "config")
#: Longest paging cursor accepted (retrieval/paging.py writes far shorter ones).
CURSOR_MAX_CHARS = 200

CANONICAL: Final = "canonical"
WORKSPACE_OVERLAY: Final = "workspace_overlay"
#: Where a stored chunk comes from: the canonical index or a run's workspace overlay.
TrustClass = Literal["canonical", "workspace_overlay"]


class Filters(Contract):
    """Payload filters: only known keys, so a typo is an error rather than a silent no-op."""

    model_config = ConfigDict(extra="forbid")

    repo: str | None = None
    tenant: str | None = None
    run_id: str | None = None
    path: str | None = None
    language: str | None = None
    resource_type: Literal["code", "docs", "config"] | None = None

    @field_validator("*", mode="before")
    @classmethod
    def _blank_is_unset(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = _valid_unicode(v).strip()
            return v or None
        return v

    def scope(self) -> dict[str, str]:
        """The filters that are set, in a stable order."""
        return {k: v for k in FILTER_KEYS if (v := getattr(self, k)) is not None}


def _valid_unicode(v: str) -> str:
    """`v`, or ValueError when it holds an unpaired surrogate.

    Why: such text is what bytes that are not UTF-8 become (a shell argument decoded with
    surrogateescape, a JSON "\\udc80" escape); it cannot be encoded for the store or a terminal,
    so it must stop here as the caller's error, not fail later as an internal one.
    """
    if has_surrogate(v):
        raise ValueError(_NOT_UNICODE)
    return v


_NOT_UNICODE = "holds a character that is not valid Unicode (an unpaired surrogate, e.g. bytes that are not UTF-8)"


def _whole_number(v: Any) -> Any:
    """44.0 -> 44: JSON Schema's "integer" admits a number with a zero fraction; `true` and "44" stay errors."""
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


class Budgets(Contract):
    model_config = ConfigDict(extra="forbid")

    # strict: `true` or "800" is not a budget (the schema says integer; lax coercion would accept them)
    tokens: int | None = Field(None, gt=0, strict=True)
    latency_ms: int | None = Field(None, gt=0, strict=True)

    _whole = field_validator("tokens", "latency_ms", mode="before")(_whole_number)


class Usage(Contract):
    tokens: int = 0
    latency_ms: float = 0.0


class RetrievalQuery(Contract):
    """What a caller asks for (CLI, Celery task and gateway alike)."""

    model_config = ConfigDict(extra="forbid")

    query: str = Field(pattern=r"\S", description="what to look for; must contain a non-blank character")
    top_k: int | None = Field(None, ge=TOP_K_MIN, le=TOP_K_MAX, strict=True)
    filters: Filters = Field(default_factory=Filters)
    overlay_policy: Literal["include", "skip"] = "include"
    transport: Literal["direct", "gateway"] = "direct"
    budgets: Budgets | None = None
    score_threshold: float | None = Field(None, ge=0.0, le=1.0, strict=True)
    # the next page of the same ranked list: a pack's `next_cursor` (retrieval/paging.py checks it)
    cursor: str | None = Field(default=None, max_length=CURSOR_MAX_CHARS, strict=True)
    # answer shaping (retrieval/shaping.py): each hit's text cut to N lines, or no text at all
    max_lines: int | None = Field(default=None, ge=1, strict=True)  # default=: a positional default is unseen by mypy
    locations_only: bool = Field(default=False, strict=True)

    _whole = field_validator("top_k", mode="before")(_whole_number)
    _whole_lines = field_validator("max_lines", mode="before")(_whole_number)

    @model_validator(mode="after")
    def _one_shape(self) -> "RetrievalQuery":
        if self.locations_only and self.max_lines is not None:
            raise ValueError(SHAPES_EXCLUSIVE)
        return self

    @field_validator("query", mode="after")
    @classmethod
    def _non_empty(cls, v: str) -> str:
        v = _valid_unicode(v).strip()
        if not v:
            raise ValueError("query must not be empty")
        return v


class ChunkPayload(Contract):
    """Exactly what is stored with every point, canonical or overlay."""

    schema_version: int = PAYLOAD_SCHEMA_VERSION
    path: str  # repo-relative, POSIX separators
    repo: str
    tenant: str
    language: str
    chunk_id: str
    chunk_hash: str  # "sha256:" + hex of the chunk text
    content_hash: str  # "sha256:" + hex of the whole file
    offset_start: int  # character offsets into the file
    offset_end: int
    line_start: int  # 1-based, inclusive
    line_end: int
    section_title: str
    chunk_sequence: int  # 0-based position within the file
    total_chunks: int
    text: str
    token_count: int
    model_version: str
    indexed_at: str  # ISO-8601 UTC
    trust_class: TrustClass = CANONICAL
    run_id: str = ""
    expires_at: float | None = None  # unix seconds; overlays only
    deleted: bool = False  # overlay tombstone: hides the path's canonical chunks
    # what the chunk defines (tree-sitter), for `rag symbols`; absent from chunks indexed before them
    symbols: list[str] = Field(default_factory=list)  # lower-cased names, qualified and short: the indexed lookup keys
    definitions: list[dict[str, Any]] = Field(default_factory=list)  # name, kind, line_start, line_end, signature


class ContextItem(Contract):
    """One retrieved chunk, with every field a caller needs to cite and trust it, untruncated."""

    score: float
    source: str
    offset_start: int
    offset_end: int
    line_start: int
    line_end: int
    trust_class: Literal["canonical", "overlay"]
    chunk_hash: str
    chunk_id: str
    section_title: str
    text: str
    content_hash: str
    chunk_sequence: int
    total_chunks: int
    token_count: int
    model_version: str
    indexed_at: str
    payload: dict[str, Any]

    @property
    def citation(self) -> str:
        return f"{self.source}#L{self.line_start}-L{self.line_end}"


class ContextPack(Contract):
    context_text: str
    items: list[ContextItem]
    filters: dict[str, str]
    budgets: Budgets | None = None
    usage: Usage = Field(default_factory=Usage)
    transport: Literal["direct", "gateway"] = "direct"
    retrieved_at: str
    telemetry_id: str
    # extensions beyond the base ContextPack (additive, documented in docs/operations.md, "Contracts")
    query: str = ""
    top_k: int = 0
    score_threshold: float = 0.0
    best_score: float | None = None  # best score seen, even when filtered out
    truncated: bool = False
    notes: list[str] = Field(default_factory=list)
    # paging (retrieval/paging.py): results above the threshold in the searched window, where this page
    # starts in them, and the cursor of the next page (None: this is the last)
    total_results: int = 0
    offset: int = 0
    next_cursor: str | None = None
    # how the items' text was shaped (retrieval/shaping.py): cut to max_lines lines, or empty (locations only)
    max_lines: int | None = None
    locations_only: bool = False
    # whether the hits' repositories may have changed since their chunks were written (owner/freshness.py):
    # "stale" names the changed files in stale_paths; None where no local tree is known to check
    freshness: Literal["fresh", "stale"] | None = None
    stale_paths: list[str] = Field(default_factory=list)


class ErrorBody(Contract):
    code: str
    message: str
    action: str


class BudgetReport(Contract):
    """Budget telemetry tags: which budget, its limit, what was spent or predicted."""

    budget_type: Literal["tokens", "latency_ms"]
    budget_limit: float
    budget_spent: float


class ErrorEnvelope(Contract):
    """The error shape everywhere JSON is spoken; budget errors also echo `usage` and `budget`."""

    error: ErrorBody
    usage: Usage | None = None
    budget: BudgetReport | None = None


class HealthStatus(Contract):
    """`GET /retrieval/health`: `ok`, or `unavailable` with a coarse reason (no names, counts or exception text)."""

    status: Literal["ok", "unavailable"]
    reason: str | None = None
    error: ErrorBody | None = None


class TokenGrant(Contract):
    """One worker token in the gateway's token file: its hash and what it may read."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    hash: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")  # sha256 of the token, never the token itself
    repos: list[str] = Field(min_length=1)
    tenants: list[str] = Field(min_length=1)
    max_top_k: int | None = Field(None, ge=TOP_K_MIN, le=TOP_K_MAX)

    @field_validator("repos", "tenants", mode="after")
    @classmethod
    def _no_blank(cls, v: list[str]) -> list[str]:
        if any(not x or x != x.strip() for x in v):
            raise ValueError("entries must be non-empty and have no surrounding whitespace")
        return v


class TokenFile(Contract):
    model_config = ConfigDict(extra="forbid")

    tokens: list[TokenGrant] = Field(default_factory=list)


def parse_query(data: dict[str, Any], *, fields: str = "flags") -> RetrievalQuery:
    """Validate a RetrievalQuery from any entry point; bad input becomes `invalid_query` with a readable reason.

    `fields` says how the caller wrote the request, so the remedy names what it can change:
    "flags" (the CLI's --query, --top-k, --filters) or "json" (the gateway's HTTP body, MCP arguments).
    """
    plain = plainly_valid_query(data)
    if plain is not None:
        return plain
    from pydantic import ValidationError

    from .errors import invalid_query

    try:
        return RetrievalQuery.model_validate(data)
    except ValidationError as exc:
        raise invalid_query(_describe(exc), _action_for(exc, fields)) from None


def plainly_valid_query(data: Any) -> RetrievalQuery | None:
    """What `RetrievalQuery.model_validate(data)` returns, built without pydantic's validator; None when not plainly valid.

    Why: the first validator pydantic builds in a process also loads its plugin machinery
    (importlib.metadata, then every installed package's entry points): most of the query's
    cost in a one-shot `rag search`. A request built from the CLI's flags or a caller's JSON
    is usually plainly valid: exact str, int, float, dict and None values inside the bounds.
    Those are built with `model_construct` from what the validators would return (stripped
    query and filters, blank filters unset, the same fields set). Anything else (another
    type, a bound, a surrogate, an unknown key, a contract that gained a field) returns None
    and pydantic validates, so every rejection and its message are pydantic's.
    tests/test_contracts.py checks both ways agree.
    """
    if type(data) is not dict or "query" not in data or not data.keys() <= _QUERY_FIELDS:
        return None
    if (RetrievalQuery.model_fields.keys() != _QUERY_FIELDS or Filters.model_fields.keys() != set(FILTER_KEYS)
            or Budgets.model_fields.keys() != _BUDGET_FIELDS):
        return None
    values: dict[str, Any] = {}
    for key, v in data.items():
        v = _PLAIN_FIELDS[key](v, data)
        if v is _UNSURE:
            return None
        values[key] = v
    if "filters" not in values:
        values["filters"] = Filters.model_construct(_fields_set=set())
    return RetrievalQuery.model_construct(_fields_set=set(data), **values)


_QUERY_FIELDS = {"query", "top_k", "filters", "overlay_policy", "transport", "budgets", "score_threshold", "max_lines",
                 "locations_only", "cursor"}
_BUDGET_FIELDS = {"tokens", "latency_ms"}
_CHOICES = {"overlay_policy": ("include", "skip"), "transport": ("direct", "gateway")}
_UNSURE: Any = object()  # a field check's "not plainly valid", since None is itself a valid value


def _if(plain: bool, v: Any) -> Any:
    return v if plain else _UNSURE


def _built(v: Any) -> Any:
    return _UNSURE if v is None else v


# per field: the value its validators would return, or _UNSURE to leave it to pydantic
_PLAIN_FIELDS: dict[str, Callable[[Any, dict[str, Any]], Any]] = {
    "query": lambda v, _: v.strip() if type(v) is str and not has_surrogate(v) and v.strip() else _UNSURE,
    "top_k": lambda v, _: _if(v is None or (type(v) is int and TOP_K_MIN <= v <= TOP_K_MAX), v),
    "score_threshold": lambda v, _: _if(v is None or (type(v) is float and 0.0 <= v <= 1.0), v),
    "overlay_policy": lambda v, _: _if(type(v) is str and v in _CHOICES["overlay_policy"], v),
    "transport": lambda v, _: _if(type(v) is str and v in _CHOICES["transport"], v),
    "filters": lambda v, _: _built(_plain_filters(v)),
    "budgets": lambda v, _: None if v is None else _built(_plain_budgets(v)),
    "cursor": lambda v, _: _if(v is None or (type(v) is str and len(v) <= CURSOR_MAX_CHARS), v),
    "max_lines": lambda v, _: _if(v is None or (type(v) is int and v >= 1), v),
    "locations_only": lambda v, data: _if(type(v) is bool and not (v and data.get("max_lines") is not None), v),
}


def _plain_filters(v: Any) -> Filters | None:
    if type(v) is not dict or not v.keys() <= set(FILTER_KEYS):
        return None
    out: dict[str, str | None] = {}
    for key, value in v.items():
        if value is not None:
            if type(value) is not str or has_surrogate(value):
                return None
            value = value.strip() or None
            if key == "resource_type" and value is not None and value not in RESOURCE_TYPES:
                return None
        out[key] = value
    return Filters.model_construct(_fields_set=set(v), **out)


def _plain_budgets(v: Any) -> Budgets | None:
    if type(v) is not dict or not v.keys() <= _BUDGET_FIELDS:
        return None
    if any(x is not None and (type(x) is not int or x <= 0) for x in v.values()):
        return None
    return Budgets.model_construct(_fields_set=set(v), **v)


def _describe(exc) -> str:
    reasons = []
    for e in exc.errors():
        loc = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            if loc.startswith("filters."):
                key = loc.split(".", 1)[1]
                reasons.append(f"unknown filter key {key!r} (known keys: {', '.join(FILTER_KEYS)})")
            else:
                reasons.append(f"unknown field {loc!r}")
        elif loc == "query" and e["type"] == "string_unicode":
            reasons.append("the query " + _NOT_UNICODE)
        elif loc == "query":
            blank = "empty" in e["msg"] or e["type"] == "string_pattern_mismatch"
            reasons.append("the query must not be empty" if blank else f"query: {e['msg']}")
        elif loc == "top_k":
            reasons.append(f"top_k must be an integer between {TOP_K_MIN} and {TOP_K_MAX}")
        elif loc == "filters.resource_type" and e["type"] == "literal_error":
            reasons.append(f"filter resource_type must be one of {', '.join(RESOURCE_TYPES)}")
        elif loc == "max_lines":
            reasons.append("max_lines must be a positive integer")
        elif not loc:  # a rule across fields (model validator)
            reasons.append(e["msg"].removeprefix("Value error, "))
        else:
            reasons.append(f"{loc}: {e['msg'].removeprefix('Value error, ')}")
    return "Invalid retrieval query: " + "; ".join(reasons) + "."


def _action_for(exc, fields: str = "flags") -> str:
    locs = {str(e["loc"][0]) if e["loc"] else "" for e in exc.errors()}
    flags = fields == "flags"
    if any(e["type"] == "string_unicode" or _NOT_UNICODE in e["msg"] for e in exc.errors()):
        return "Pass text encoded as UTF-8." if flags else "Send text that is valid Unicode (no unpaired surrogates)."
    if "query" in locs:
        return 'Pass a non-empty --query "what you are looking for".' if flags else 'Send a non-empty "query" string.'
    if any(e["loc"][:2] == ("filters", "resource_type") and e["type"] == "literal_error" for e in exc.errors()):
        kinds = ", ".join(RESOURCE_TYPES)
        return f"Use --filters resource_type=KIND with KIND among: {kinds}." if flags else f'Send "resource_type" among: {kinds}.'
    if "filters" in locs:
        keys = ", ".join(FILTER_KEYS)
        if flags:
            return f"Use --filters key=value with keys among: {keys}."
        return f'Send "filters" as an object of strings with keys among: {keys}.'
    if "top_k" in locs:
        if flags:
            return f"Pass --top-k between {TOP_K_MIN} and {TOP_K_MAX}."
        return f'Send "top_k" as an integer between {TOP_K_MIN} and {TOP_K_MAX}.'
    if "max_lines" in locs:
        return "Pass --max-lines N with N >= 1." if flags else 'Send "max_lines" as an integer >= 1.'
    if any(SHAPES_EXCLUSIVE in e["msg"] for e in exc.errors()):
        return ("Pass either --locations-only or --max-lines N, not both." if flags
                else 'Send either "locations_only": true or "max_lines", not both.')
    return "Fix the request fields named above and retry."


class SymbolHit(Contract):
    """One place a name is defined (or, ranked after, mentioned): what `rag symbols` returns."""

    name: str  # the qualified name defined there (`Router.handle`); the asked name for a mention
    kind: str  # function, method, class, struct, interface, type, ...; "mention"; "definition" when not recorded
    match: Literal["exact", "qualified", "partial", "mention"]
    path: str
    repo: str
    tenant: str
    line_start: int
    line_end: int
    signature: str  # the definition's first line (a mention: the line that mentions it)
    citation: str  # path#Lstart-Lend
    chunk_id: str
    score: float
    guessed: bool = False  # from a chunk indexed before symbol metadata: kind and signature read from its text


class SymbolsResult(Contract):
    """`rag symbols NAME`: where NAME is defined, best first (exact name, then qualified or partial, then mentions)."""

    query: str
    symbols: list[SymbolHit]
    filters: dict[str, str]
    transport: Literal["direct", "gateway"] = "direct"
    top_k: int = 0
    latency_ms: float = 0.0
    notes: list[str] = Field(default_factory=list)
