"""BM25 terms: identifier splitting and the light stemmer that joins a word's forms."""

from __future__ import annotations

from moonmind_worker.text import lexical


def test_a_plural_meets_its_singular_when_the_word_ends_in_e():
    # the old stemmer cut `routes` to `rout` (an `-es` plural) while `route` stayed `route`
    for singular, plural in (("route", "routes"), ("value", "values"), ("type", "types"), ("message", "messages"),
                             ("process", "processes"), ("match", "matches"), ("dependency", "dependencies")):
        assert lexical.terms(singular) == lexical.terms(plural), (singular, plural)
    for word in ("process", "status", "analysis"):  # not plurals: the final s stays
        assert lexical.terms(word) == [word]


def test_a_plural_query_finds_the_singular_by_bm25():
    doc_ids, doc_weights = lexical.document_vector("def add_route(path, handler):\n    route = Route(path)")
    q_ids, _ = lexical.query_vector("register routes")
    assert set(q_ids) & set(doc_ids)
