"""Where an index run cuts its work: the batching policy of `indexer.IndexRun`, apart from the store.

Why apart: where a batch is cut decides the stored vectors (the static model's last bits depend on
the batch a text is embedded with), and what waits where bounds the run's memory; the rules are
stated once here and tested without a store, a model or processes (tests/test_index_batching.py).
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Literal, Protocol

#: What `store_due` asks of a write: one that fills the store's open segment (a build follows it), or a plain one.
BUILD: Literal["build"] = "build"
WRITE: Literal["write"] = "write"


class Limits(Protocol):
    """The bounds a run's pool sets (`workers.Pool`): a chunking group's size, and how much may be in flight."""

    group_chars: int
    group_files: int
    files_in_flight: int
    chars_in_flight: int
    batches_in_flight: int


def batch_chunks(embedding_batch_size: int) -> int:
    """Chunks per embedding batch (one points job): four of the embedder's batches, and at least 256."""
    return max(embedding_batch_size * 4, 256)


def group_full(chars: int, files: int, limits: Limits) -> bool:
    """Changed files are sent to a chunking job once their text or their number reaches the pool's group size."""
    return chars >= limits.group_chars or files >= limits.group_files


def may_take(job: Future | None, *, block: bool, files: int, chars: int, limits: Limits) -> bool:
    """The head of the line is handed on once its chunking job is sent and either done, or waited for.

    Waited for at the end of the walk (`block`), or when the line (`files`, `chars` of text) is past
    the pool's bounds; a head not yet sent holds back the files behind it, so files go on in walk order.
    """
    return job is not None and (
        block or job.done() or files > limits.files_in_flight or chars > limits.chars_in_flight
    )


def batch_full(chunks: int, batch_chunks: int) -> bool:
    """The chunks handed on are flushed to an embedding job once they make a batch."""
    return chunks >= batch_chunks


def may_store(job: Future, *, block: bool, batches: int, limits: Limits) -> bool:
    """The oldest batch being embedded is taken to be stored once done, or waited for (at the end, or past the pool's bound)."""
    return block or job.done() or batches > limits.batches_in_flight


def store_due(held: int, room: int | None, write_points: int) -> Literal["build", "write"] | None:
    """Whether the points held (embedded, not stored) are written now, and how.

    `BUILD` when they fill what the store's open segment has room for (`Store.room`, None: no such
    limit), `WRITE` once there are `write_points` of them, else None (they wait for more).
    """
    if room is not None and held >= room:
        return BUILD
    if held >= write_points:
        return WRITE
    return None
