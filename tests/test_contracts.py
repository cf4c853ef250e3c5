"""The contracts' fast paths agree with pydantic: `plainly_valid_query` and `json_dump`.

A one-shot `rag search` builds no pydantic validator or serializer (building the first one also
loads pydantic's plugin machinery). These tests hold the two shortcuts to the contract models:
a plainly valid query is the query pydantic validates, anything else is left to pydantic (so
its rejection and error envelope are pydantic's), and a pack's JSON is pydantic's JSON.
"""

from __future__ import annotations

import json
import random

import pytest

from moonmind_worker import contracts
from moonmind_worker.contracts import (
    Budgets,
    ContextPack,
    Filters,
    RetrievalQuery,
    json_dump,
    parse_query,
    plainly_valid_query,
)
from moonmind_worker.errors import MoonmindError

#: Each field's candidate values: valid, borderline and invalid ones (another type, a bound, a surrogate).
CANDIDATES: dict[str, list] = {
    "query": ["x", "  padded query  ", "übersetzung 翻訳", "a" * 2000, "", "   ", "\t\n", "\x1c", "ok\udc80", 5, None, b"bytes"],
    "top_k": [None, 1, 8, 50, 0, 51, -1, 5.0, 5.5, True, "5"],
    "filters": [
        {}, {"repo": "r"}, {"repo": " r ", "tenant": "t"}, {"repo": ""}, {"repo": "  "}, {"repo": None},
        {"path": "a/b.py", "language": "python", "run_id": "run-1"}, {"resource_type": " docs "},
        {"nokey": "x"}, {"repo": 5}, {"repo": "\udc80"}, {"resource_type": "doc"}, {"resource_type": "Code"},
        None, "repo=x", [("repo", "r")],
    ],
    "overlay_policy": ["include", "skip", "other", None, 1],
    "transport": ["direct", "gateway", "queue", None],
    "budgets": [
        None, {}, {"tokens": 600}, {"latency_ms": 800, "tokens": 1}, {"tokens": None}, {"tokens": 0}, {"tokens": -1},
        {"tokens": True}, {"tokens": 5.0}, {"tokens": "5"}, {"other": 1}, "tokens=5",
    ],
    "score_threshold": [None, 0.0, 1.0, 0.5, -0.0, -0.1, 1.1, float("nan"), 1, True, "0.5"],
    "cursor": [None, "p1.abc", "", "x" * 200, "x" * 201, 5, True, ["p1.abc"]],
    "max_lines": [None, 1, 10, 0, -1, 5.0, 5.5, True, "5"],
    "locations_only": [False, True, None, 0, 1, "true"],
}
#: How many of each field's candidates (the first ones) are plainly valid.
PLAIN = {"query": 4, "top_k": 4, "filters": 8, "overlay_policy": 2, "transport": 2, "budgets": 5, "score_threshold": 5,
         "cursor": 4, "max_lines": 3, "locations_only": 2}
#: Missing from the request altogether (the field's default applies).
ABSENT = object()


def _requests() -> list[dict]:
    """A valid base request with each field varied alone (absent too), plus seeded random combinations and an unknown key."""
    base = {"query": "bearer token", "top_k": None, "filters": {"repo": "demo"}, "overlay_policy": "include",
            "score_threshold": None}
    out = [dict(base), {"query": "only the query"}, {**base, "nokey": 1}, {}]
    for field, values in CANDIDATES.items():
        for v in [*values, ABSENT]:
            r = dict(base)
            if v is ABSENT:
                r.pop(field, None)
            else:
                r[field] = v
            out.append(r)
    rng = random.Random(20)
    for _ in range(1500):  # plainly valid values only (both answer shapes at once is the one rejection among them)
        out.append({field: rng.choice(values[:PLAIN[field]]) for field, values in CANDIDATES.items() if rng.random() < 0.8}
                   | {"query": rng.choice(CANDIDATES["query"][:PLAIN["query"]])})
    for _ in range(3000):
        r = {}
        for field, values in CANDIDATES.items():
            v = rng.choice([*values, ABSENT])
            if v is not ABSENT:
                r[field] = v
        out.append(r)
    return out


def _snapshot(model) -> tuple:
    """Everything a caller could observe of a validated model: values with their types, and which fields were set."""
    def values(m):
        return {name: (type(v).__name__, values(v) if isinstance(v, contracts.Contract) else v)
                for name, v in ((n, getattr(m, n)) for n in type(m).model_fields)}

    def fields_set(m):
        return (sorted(m.model_fields_set),
                {n: fields_set(getattr(m, n)) for n in type(m).model_fields if isinstance(getattr(m, n), contracts.Contract)})

    return type(model), json.dumps(values(model), sort_keys=True, default=repr), fields_set(model)


def test_a_plainly_valid_query_is_exactly_the_query_pydantic_validates_and_the_rest_is_left_to_pydantic():
    built = rejected = 0
    for request in _requests():
        plain = plainly_valid_query(request)
        try:
            validated = RetrievalQuery.model_validate(request)
        except Exception:  # noqa: BLE001 - pydantic rejects it: the fast path must not build it
            assert plain is None, request
            rejected += 1
            continue
        if plain is not None:
            assert _snapshot(plain) == _snapshot(validated), request
            built += 1
    assert built > 1000 and rejected > 1000  # both ways are exercised


@pytest.mark.parametrize("request_", [
    {"query": "   "}, {"query": "x", "top_k": 0}, {"query": "x", "filters": {"nokey": "v"}}, {"query": "x", "top_k": True},
    {"query": "ok\udc80"}, {"query": "x", "budgets": {"tokens": "5"}}, {"query": "x", "score_threshold": 2.0},
])
def test_a_bad_request_gets_pydantics_error_envelope(request_):
    assert plainly_valid_query(request_) is None
    with pytest.raises(MoonmindError) as err:
        parse_query(request_)
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as exc:
        RetrievalQuery.model_validate(request_)
    assert (err.value.code, err.value.message, err.value.action) == (
        "invalid_query", contracts._describe(exc.value), contracts._action_for(exc.value))


def test_the_fast_path_knows_the_contracts_fields_and_rules():
    """A changed RetrievalQuery, Filters or Budgets fails here: update `plainly_valid_query` to the new rules, then this."""
    def rules(model) -> dict:
        return {
            "fields": {n: str(f) for n, f in model.model_fields.items()},
            "validators": sorted((k, v.info.fields, v.info.mode) for k, v in model.__pydantic_decorators__.field_validators.items()),
            "config": dict(model.model_config),
        }

    assert rules(RetrievalQuery) == {
        "fields": {
            "query": "annotation=str required=True description='what to look for; must contain a non-blank character' "
                     "metadata=[_PydanticGeneralMetadata(pattern='\\\\S')]",
            "top_k": "annotation=Union[int, NoneType] required=False default=None metadata=[Strict(strict=True), Ge(ge=1), Le(le=50)]",
            "filters": "annotation=Filters required=False default_factory=Filters",
            "overlay_policy": "annotation=Literal['include', 'skip'] required=False default='include'",
            "transport": "annotation=Literal['direct', 'gateway'] required=False default='direct'",
            "budgets": "annotation=Union[Budgets, NoneType] required=False default=None",
            "score_threshold": "annotation=Union[float, NoneType] required=False default=None "
                               "metadata=[Strict(strict=True), Ge(ge=0.0), Le(le=1.0)]",
            "cursor": "annotation=Union[str, NoneType] required=False default=None "
                      "metadata=[Strict(strict=True), MaxLen(max_length=200)]",
            "max_lines": "annotation=Union[int, NoneType] required=False default=None metadata=[Strict(strict=True), Ge(ge=1)]",
            "locations_only": "annotation=bool required=False default=False metadata=[Strict(strict=True)]",
        },
        "validators": [("_non_empty", ("query",), "after"), ("_whole", ("top_k",), "before"),
                       ("_whole_lines", ("max_lines",), "before")],
        "config": {"defer_build": True, "extra": "forbid"},
    }
    assert rules(Filters) == {
        "fields": {**{k: "annotation=Union[str, NoneType] required=False default=None" for k in contracts.FILTER_KEYS},
                   "resource_type": "annotation=Union[Literal['code', 'docs', 'config'], NoneType] required=False default=None"},
        "validators": [("_blank_is_unset", ("*",), "before")],
        "config": {"defer_build": True, "extra": "forbid"},
    }
    assert rules(Budgets) == {
        "fields": {k: "annotation=Union[int, NoneType] required=False default=None metadata=[Strict(strict=True), Gt(gt=0)]"
                   for k in ("tokens", "latency_ms")},
        "validators": [("_whole", ("tokens", "latency_ms"), "before")],
        "config": {"defer_build": True, "extra": "forbid"},
    }


SEARCHES = [
    {"query": "where are bearer tokens checked", "filters": {"repo": "demo"}},
    {"query": "connection pool", "top_k": 20, "score_threshold": 0.0},
    {"query": "session middleware", "budgets": {"tokens": 600}, "score_threshold": 0.0},
    {"query": "validate token", "score_threshold": 0.99},
    {"query": "signals", "filters": {"repo": "nope"}},
    {"query": "  übersetzung gettext  ", "top_k": 20, "overlay_policy": "skip", "score_threshold": 0.0},
]


def test_the_pipelines_packs_are_what_validation_gives_and_dump_as_pydantic_dumps_them(prebuilt, tmp_path):
    from moonmind_worker import runtime
    from moonmind_worker.observe.artifacts import record_pack
    from moonmind_worker.retrieval.pipeline import retrieve_context_pack
    from moonmind_worker.settings import get_settings

    settings = get_settings()
    embedder, store = runtime.get_embedder(settings), runtime.get_store(settings)
    items = 0
    for request in SEARCHES:
        pack = retrieve_context_pack(parse_query(request), settings=settings, embedder=embedder, store=store)
        items += len(pack.items)
        dumped = json_dump(pack)
        assert json.dumps(dumped, ensure_ascii=False) == json.dumps(pack.model_dump(mode="json"), ensure_ascii=False)
        # built without validation, yet validating the same values changes nothing (no coercion was skipped)
        # (values and their types: a dump carries every key, so its fields-set differs by construction)
        assert _snapshot(ContextPack.model_validate(pack.model_dump()))[:2] == _snapshot(pack)[:2]
        artifact = record_pack(pack, settings)
        assert artifact is not None and json.loads(artifact.read_text(encoding="utf-8")) == json.loads(pack.model_dump_json())
    assert items > 10


def test_json_dump_leaves_values_that_are_not_plain_json_to_pydantic():
    from moonmind_worker.contracts import ErrorBody, HealthStatus, Usage
    from moonmind_worker.retrieval.context_pack import item_from_payload

    payload = {"path": "a.py", "offset_start": 0, "offset_end": 1, "line_start": 1, "line_end": 1, "chunk_hash": "h",
               "chunk_id": "c", "text": "x", "content_hash": "h", "chunk_sequence": 0, "total_chunks": 1, "token_count": 1,
               "model_version": "m", "indexed_at": "t", "odd": (1, 2)}  # a tuple in the Any-typed payload
    odd = [
        Usage.model_construct(tokens=1, latency_ms=float("inf")),  # pydantic's JSON mode decides what inf becomes
        item_from_payload(payload, 0.5),
        HealthStatus(status="unavailable", reason="x", error=ErrorBody(code="c", message="m", action="a")),
    ]
    for model in odd:
        assert json_dump(model) == model.model_dump(mode="json")
