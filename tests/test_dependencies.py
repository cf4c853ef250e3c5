"""What the code relies on inside its dependencies, checked against the installed versions.

pyproject.toml pins celery, kombu, qdrant-edge-py, uvicorn and pathspec below their next minor release
(watchfiles below its next major); when a pin is raised, these tests say whether what the code uses is
still there before anything else breaks in a subtler way. uvicorn's private surface has its own canary, test_uvicorn_adapter.py.
"""

from __future__ import annotations

import inspect


def test_celery_still_has_the_success_log_format_and_the_backend_hook_the_worker_overrides():
    from celery import Celery
    from celery.app import trace

    assert isinstance(trace.LOG_SUCCESS, str) and "%(name)s" in trace.LOG_SUCCESS
    assert callable(getattr(Celery, "_get_backend", None))
    assert "store_result" in dict(inspect.getmembers(Celery("probe").backend))


def test_kombu_counts_a_queues_consumers_with_a_passive_declare():
    from kombu.transport.pyamqp import Channel

    assert "passive" in inspect.signature(Channel.queue_declare).parameters


def test_qdrant_edge_still_exports_every_name_the_store_uses():
    import qdrant_edge

    used = ("CountRequest", "Distance", "EdgeConfig", "EdgeOptimizersConfig", "EdgeShard", "EdgeVectorParams",
            "FieldCondition", "Filter", "MatchAny", "MatchValue", "Point", "Prefetch", "Query", "QueryBatchRequest",
            "QueryRequest", "RangeFloat", "ScrollRequest", "SparseVector", "UpdateOperation")
    assert [name for name in used if not hasattr(qdrant_edge, name)] == []
    for method in ("load", "update", "query_batch", "retrieve", "scroll", "count", "optimize", "flush", "close", "info"):
        assert hasattr(qdrant_edge.EdgeShard, method), method


def test_pathspec_still_translates_a_name_segment_through_the_hook_the_bounded_pattern_overrides():
    from pathspec.patterns.gitignore.spec import GitIgnoreSpecPattern

    hook = inspect.getattr_static(GitIgnoreSpecPattern, "_translate_segment_glob")
    assert isinstance(hook, staticmethod)
    assert list(inspect.signature(GitIgnoreSpecPattern._translate_segment_glob).parameters) == ["pattern", "range_error"]


def test_watchfiles_still_takes_the_keywords_and_reports_the_changes_the_owners_watcher_uses():
    import watchfiles

    used = ("watch_filter", "debounce", "step", "stop_event", "rust_timeout", "raise_interrupt", "ignore_permission_denied")
    params = inspect.signature(watchfiles.watch).parameters
    assert [name for name in used if name not in params] == []
    assert {c.name for c in watchfiles.Change} >= {"added", "modified", "deleted"}
