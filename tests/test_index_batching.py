"""Where an index run cuts its work (`indexing.batching`, as `indexer.IndexRun` uses it), without a store.

Why it matters: the batch a chunk is embedded with decides its vector's last bits, and the line's
bounds decide the run's memory; these pin the rules with a stand-in pool, no model and no processes.
"""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace

import pytest

from moonmind_worker.indexing.batching import BUILD, WRITE, batch_chunks, batch_full, group_full, may_store, may_take, store_due
from moonmind_worker.indexing.indexer import WRITE_POINTS, IndexRun


def _limits(**kw) -> SimpleNamespace:
    values = dict(group_chars=100, group_files=3, files_in_flight=4, chars_in_flight=1000, batches_in_flight=2)
    return SimpleNamespace(**{**values, **kw})


def _job(done: bool) -> Future:
    f: Future = Future()
    if done:
        f.set_result(None)
    return f


def test_a_group_is_sent_once_its_text_reaches_the_group_size():
    assert not group_full(99, 1, _limits())
    assert group_full(100, 1, _limits())


def test_a_group_is_sent_once_it_holds_the_group_files_however_little_text():
    assert not group_full(3, 2, _limits())
    assert group_full(3, 3, _limits())


def test_a_file_not_yet_sent_to_chunking_holds_back_the_line_even_at_the_end():
    assert not may_take(None, block=True, files=99, chars=10_000, limits=_limits())


def test_the_head_of_the_line_is_taken_once_its_chunks_are_done():
    assert may_take(_job(True), block=False, files=1, chars=1, limits=_limits())
    assert not may_take(_job(False), block=False, files=4, chars=1000, limits=_limits())  # within both bounds: no wait


@pytest.mark.parametrize("files, chars", [(5, 0), (1, 1001)], ids=["files", "text"])
def test_a_line_past_either_bound_waits_for_its_head(files, chars):
    assert may_take(_job(False), block=False, files=files, chars=chars, limits=_limits())


def test_a_batch_is_flushed_to_embedding_at_four_embedder_batches_and_never_under_256_chunks():
    assert batch_chunks(64) == 256 and batch_chunks(16) == 256 and batch_chunks(100) == 400
    assert not batch_full(255, 256) and batch_full(256, 256) and batch_full(300, 256)


def test_an_embedded_batch_is_stored_when_done_or_with_too_many_batches_in_flight():
    assert may_store(_job(True), block=False, batches=1, limits=_limits())
    assert not may_store(_job(False), block=False, batches=2, limits=_limits())
    assert may_store(_job(False), block=False, batches=3, limits=_limits())
    assert may_store(_job(False), block=True, batches=1, limits=_limits())


def test_held_points_are_written_at_write_points():
    assert store_due(WRITE_POINTS - 1, None, WRITE_POINTS) is None
    assert store_due(WRITE_POINTS, None, WRITE_POINTS) == WRITE


def test_a_write_that_fills_the_stores_segment_comes_before_write_points():
    assert store_due(10, 10, WRITE_POINTS) == BUILD
    assert store_due(9, 10, WRITE_POINTS) is None
    assert store_due(WRITE_POINTS + 5, WRITE_POINTS + 5, WRITE_POINTS) == BUILD  # the build decides, not the count


class _Pool(SimpleNamespace):
    """A stand-in `workers.Pool`: chunking jobs stay open until the test finishes them."""

    def __init__(self, **limits) -> None:
        super().__init__(**vars(_limits(**limits)), groups=[], jobs=[])

    def chunk(self, group, chunk_chars, overlap_lines, redact) -> Future:
        self.groups.append([rel for rel, _ in group])
        self.jobs.append((_job(False), [[f"{rel}#0"] for rel, _ in group]))
        return self.jobs[-1][0]

    def finish(self, i: int) -> None:
        job, chunks = self.jobs[i]
        job.set_result(chunks)

    def result(self, job: Future):
        return job.result(timeout=0)


class _Reader:
    def __init__(self, texts: dict[str, str]) -> None:
        self.texts = texts

    def read(self, rel, max_bytes):
        return self.texts[rel], None, None  # (text, reason skipped, stat): no file behind it


def _run(texts: dict[str, str], pool: _Pool) -> IndexRun:
    """An IndexRun past its setup, with no store: reading, grouping and taking only."""
    settings = SimpleNamespace(chunk_chars=1500, chunk_overlap_lines=0, max_file_bytes=10**6, redact_secrets="on")
    run = IndexRun(Path("."), repo="r", tenant="t", settings=settings, embedder=None, store=None)
    run.pool, run.reader, run.stored, run.rechunk = pool, _Reader(texts), {}, False
    run.files = [(rel, Path(rel)) for rel in texts]
    run.batch_chunks = 10**6  # no batch is flushed: nothing is embedded or written
    return run


def test_a_run_cuts_its_chunking_groups_at_the_pools_group_size_and_sends_the_rest_at_the_end():
    pool = _Pool(group_files=2, group_chars=25, files_in_flight=10)  # no wait for chunks: none are done
    run = _run({"a": "x" * 5, "b": "x" * 5, "c": "x" * 30, "d": "x" * 5, "e": "x" * 5}, pool)
    for rel, _ in run.files:
        run._read(rel)
    run._send_group()
    assert pool.groups == [["a", "b"], ["c"], ["d", "e"]]


def test_a_run_hands_files_on_in_walk_order_when_a_later_group_is_chunked_first():
    pool = _Pool(group_files=2)
    run = _run({rel: "text" for rel in "abcd"}, pool)
    run._read("a"), run._read("b")
    run._read("c"), run._read("d")
    pool.finish(1)  # the second group's chunks are in first
    run._take(block=False)
    assert run.taken == 0 and [e.rel for e in run.line] == ["a", "b", "c", "d"]
    pool.finish(0)
    run._take(block=False)
    assert [rel for rel, _, _ in run.pending] == ["a", "b", "c", "d"] and run.line_chars == 0

