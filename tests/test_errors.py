"""The one error table: every code states each category, and the categories agree with each other."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from moonmind_worker.errors import CODES, EXIT_CONFIG, EXIT_CONNECTIVITY, HEALTH_REASONS, TRAITS, codes_that

ROOT = Path(__file__).resolve().parent.parent
DOCS = "\n".join(p.read_text() for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")])


@pytest.mark.parametrize("code", sorted(CODES))
def test_every_code_states_each_category_with_a_known_value(code):
    row = CODES[code]
    assert set(row._fields) == {"exit", "http", "traits", "health"}
    assert isinstance(row.exit, int) and 100 <= row.http <= 599
    assert row.traits <= TRAITS, f"{code}: unknown trait in {sorted(row.traits)}"
    assert row.health is None or row.health in HEALTH_REASONS


def test_what_the_gateway_tells_callers_is_a_4xx_and_never_falls_back_on_a_callers_mistake():
    for code in codes_that("caller"):
        assert 400 <= CODES[code].http < 500, code
    for code in codes_that("fallback"):
        assert CODES[code].http >= 500 or CODES[code].http == 408, f"{code}: a 4xx is the caller's, not the gateway's"


def test_only_infrastructure_failures_are_retried_by_tasks():
    for code in codes_that("transient"):
        assert CODES[code].exit in (EXIT_CONFIG, EXIT_CONNECTIVITY), code


def test_the_status_only_fallback_names_a_code_with_that_status():
    from moonmind_worker.transports.gateway_client import _BY_STATUS

    for status, code in _BY_STATUS.items():
        assert CODES[code].http == status


@pytest.mark.parametrize("code", sorted(CODES))
def test_every_code_is_documented(code):
    assert re.search(rf"\b{code}\b", DOCS), f"{code} is not in README.md or docs/"


def test_the_sets_the_rest_of_the_code_uses_are_the_tables_columns():
    import tasks.rag
    from moonmind_worker.gateway import app as gateway
    from moonmind_worker.transports import gateway_client

    assert tasks.rag.TRANSIENT_CODES == codes_that("transient")
    assert gateway_client.FALLBACK_CODES == codes_that("fallback")
    assert gateway.CALLER_CODES == codes_that("caller")
