"""The embedded store's shard as the engine keeps it (edge.py): created with its indexes, loaded, flushed.

The settings this version gives every shard (dense vectors, optimizers, payload indexes) come in as
arguments: they are edge.py's, where a test swaps them for an older version's to make such a store.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

from .base import DENSE, SPARSE
from .edge_disk import no_room, room_to_open

#: The HNSW graph's construction beam (the engine's default is 100; m and the threshold stay the defaults).
#: Why lower: a segment's graph is the largest CPU cost of a cold index's writer, and a capped segment (~16k
#: chunks) searched with a wide beam (base.DENSE_SEARCH_BEAM) needs no wider one: 64 gave the same packs on
#: Django (BENCHMARKS.md, "The HNSW graph"). The engine fixes it at a shard's creation: a store made before
#: keeps 100. Not fewer links (m 8): a Django graph built so left one query's nearest chunks out of reach.
EF_CONSTRUCT = 64
#: Links per point in the graph (the engine's default): `python -m bench.dense_graph` compares others.
HNSW_M = 16
#: A shard holding fewer points than this many full segments gets no graph (links 0): every dense search
#: scans its vectors whole. Why: exact (recall 1, the same results whatever thread built what), and the
#: graph was the largest share of a cold index's writer; with the filter conditions every point holds
#: dropped (edge_census.py) a whole scan of Django's 30,859 chunks costs ~0.5 ms a dense request more than
#: the graph. Why two: the optimize that gives a shard the graph rebuilds every segment at once, its memory
#: growing ~75 MiB a segment (2 + a small one: 341 MiB; 3: 471; 4: 540), so with the one being written at
#: most three are rebuilt, within the run's 500 MB. Figures: BENCHMARKS.md ("The HNSW graph").
GRAPH_FROM_SEGMENTS = 2
#: meta.json's record of a store created without the graph ("exact") until it took it ("graph"); a store
#: made before has none and keeps the graph it was created with.
DENSE_KEY, EXACT, GRAPH = "dense_search", "exact", "graph"
#: Segments with less than this many KB of dense vectors are searched whole, graph or not (the engine's default).
FULL_SCAN_KB = 10_000


def create(path: Path, dense: Any, optimizers: Any, wal: bool, indexes: Sequence[tuple[str, Any]]) -> Any:
    """A new shard at `path` with these dense vectors, optimizers and payload indexes (name, parameters), flushed;
    without a graph (see GRAPH_FROM_SEGMENTS).

    Why Cached for the graph, the sparse index and the payload indexes (the engine's defaults pin
    them in RAM): pinned, every open copies them onto the heap (the sparse index, and a map per
    payload field), a cost that grows with the index and that a one-shot search pays whole;
    cached, they are memory-mapped from the same files and searched the same way (the same
    results), warmed into the page cache instead of copied. Not Cold: that evicts the files
    from the page cache on every open, and the first query then reads them from disk.
    """
    from qdrant_edge import EdgeConfig, EdgeShard, EdgeSparseVectorParams, Memory

    cached = Memory.Cached
    config = EdgeConfig(
        vectors={DENSE: dense},
        # no IDF modifier: the engine's would count every repository in the shard (see lexstats)
        sparse_vectors={SPARSE: EdgeSparseVectorParams(memory=cached)},
        hnsw_config=_hnsw(graph=False),
        optimizers=optimizers,
        wal_enabled=None if wal else False,
    )
    shard = EdgeShard.create(str(path), config)
    add_indexes(shard, indexes)
    shard.flush()
    return shard


def add_indexes(shard: Any, indexes: Sequence[tuple[str, Any]]) -> None:
    """Create these payload indexes (name, parameters) in `shard`."""
    from qdrant_edge import UpdateOperation

    for name, params in indexes:
        shard.update(UpdateOperation.create_field_index(name, params))


def _hnsw(graph: bool) -> Any:
    from qdrant_edge import HnswIndexConfig, Memory

    return HnswIndexConfig(m=HNSW_M if graph else 0, ef_construct=EF_CONSTRUCT, full_scan_threshold=FULL_SCAN_KB,
                           memory=Memory.Cached)


def graph_due(meta: dict[str, Any] | None, points: Callable[[], int], segment_points: int) -> bool:
    """Whether a store created without the graph (its `meta`) has grown to take it (`points`: how many it holds;
    `segment_points`: how many fill a segment)."""
    return (meta or {}).get(DENSE_KEY) == EXACT and points() >= GRAPH_FROM_SEGMENTS * segment_points


def given_again(dense: Any, optimizers: Any, graph: bool = False) -> Any:
    """The settings a shard is loaded with again (`load`'s config): the segment cap and the dense vectors' placement,
    and the graph when it is due (see GRAPH_FROM_SEGMENTS).

    A store created before them takes them then (the engine records them), before the optimize they
    bound; the shard's other settings stay its own. Given the graph, the next optimize rebuilds every
    segment built without one (the engine compares each segment's settings with the shard's).
    """
    from qdrant_edge import EdgeConfig

    return EdgeConfig(vectors={DENSE: dense}, optimizers=optimizers, hnsw_config=_hnsw(True) if graph else None)


def load(path: Path, where: Path, config: Any = None) -> tuple[Any, bool]:
    """The shard at `path` loaded (`config`: settings given again), and whether it logs its writes ahead.

    `where` is the store's directory, whose disk room an open on tmpfs needs (edge_disk.room_to_open).
    """
    from qdrant_edge import EdgeShard

    room_to_open(where, path)
    with no_room(where, "opening the store"):
        shard = EdgeShard.load(str(path), config)
    return shard, (path / "wal").is_dir()


def flush(shard: Any, wal: bool, where: Path) -> None:
    """Make every write durable; a shard with a write-ahead log (`wal`) then ends it with an empty entry.

    Why the empty entry (an empty delete): the engine acknowledges the WAL up to its last
    entry on flush, and every later open decodes that acknowledged entry again before
    skipping it. After an index run that is the last upsert batch (a batch of vectors and
    chunk text, CBOR-decoded on every one-shot search); an empty entry costs nothing to
    decode. The log still holds every write, so durability is unchanged.
    """
    from qdrant_edge import UpdateOperation

    with no_room(where, "flushing the store"):
        if wal:
            shard.update(UpdateOperation.delete_points([]))
        shard.flush()
