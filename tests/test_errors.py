"""The one error table: every code states each category, and the categories agree with each other."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from moonmind_worker.errors import (
    CODES,
    EXIT_CONFIG,
    EXIT_CONNECTIVITY,
    HEALTH_REASONS,
    TRAITS,
    MoonmindError,
    codes_that,
)

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
    from moonmind_worker.errors import TransientTaskError, task_error
    from moonmind_worker.gateway import app as gateway
    from moonmind_worker.transports import gateway_client

    for code in CODES:  # a write task retries exactly the transient codes (autoretry_for)
        retried = isinstance(task_error(MoonmindError(code, "m", "a")), TransientTaskError)
        assert retried == (code in codes_that("transient")), code
    assert gateway_client.FALLBACK_CODES == codes_that("fallback")
    assert gateway.CALLER_CODES == codes_that("caller")


def test_every_error_is_an_instance_of_its_exit_class_and_of_its_traits():
    from moonmind_worker import errors

    exits = {errors.EXIT_USAGE: errors.UsageError, errors.EXIT_CONFIG: errors.ConfigError,
             errors.EXIT_CONNECTIVITY: errors.ConnectivityError, errors.EXIT_BUDGET: errors.BudgetError,
             errors.EXIT_INTERNAL: errors.InternalError}
    traits = {"transient": errors.TransientError, "fallback": errors.FallbackError, "caller": errors.CallerError}
    for code, row in CODES.items():
        err = MoonmindError(code, "what", "do this")
        assert isinstance(err, exits[row.exit]) and isinstance(err, MoonmindError), code
        assert {t for t, cls in traits.items() if isinstance(err, cls)} == set(row.traits), code
        assert (err.code, err.exit_code, type(err)) == (code, row.exit, errors.error_class(code))


def test_an_error_crosses_a_process_boundary_whole():
    import pickle

    err = pickle.loads(pickle.dumps(MoonmindError("store_busy", "in use by PID 7", "stop it", pid=7)))
    assert (type(err).__name__, err.code, err.message, err.action, err.details) == (
        "StoreBusyError", "store_busy", "in use by PID 7", "stop it", {"pid": 7})


def test_write_tasks_retry_with_celerys_backoff_and_jitter_and_searches_do_not():
    import tasks.rag
    from moonmind_worker.errors import TransientTaskError

    for task in (tasks.rag.index, tasks.rag.overlay_upsert, tasks.rag.overlay_clean, tasks.rag.sweep_expired_overlays):
        assert tuple(task.autoretry_for) == (TransientTaskError,), task.name
        assert task.retry_backoff and task.retry_jitter and task.max_retries == 4, task.name
    assert not tuple(getattr(tasks.rag.search, "autoretry_for", ()))
