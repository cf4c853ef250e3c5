"""The store seam: every operation callers use, and the types that cross it.

Both engines hold the same collection shape: a cosine `dense` vector, a `bm25` sparse
vector of term-frequency weights (no engine IDF: `lexstats` weighs the query per scope), and the `ChunkPayload` schema with payload
indexes created up front. Filters are expressed once (`Where`) and translated to
each engine (`edge.py`, `remote.py`), so a scope filter can never mean different
things on the two paths.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Protocol, Sequence

if TYPE_CHECKING:  # annotations only: a query vector may be an array('f') (embedding.static_query)
    from array import array

    import numpy as np

from ..errors import MoonmindError

DENSE = "dense"
SPARSE = "bm25"
#: How many graph candidates a dense search weighs (HNSW's `ef`; the engines' default is the larger of the
#: limit and the build beam, 80 for the pipeline's pool). Why wider: at 80 the walk missed some of a large
#: repository's nearest chunks, and which ones changed with every build of the graph (its threads race), so two
#: indexes of one tree gave different packs; at 200 a Django search finds 99.7% of an exact scan's top 80 (99.0%
#: at 80; the worst query 97.5% against 90–94%) for ~0.2 ms more. BENCHMARKS.md ("The HNSW graph").
DENSE_SEARCH_BEAM = 200
#: Collection metadata key: its value says the sparse vectors carry no engine IDF and BM25's
#: statistics are each repository's own (`lexstats`); a collection without it predates that.
LEXICAL_FORMAT_KEY = "lexical_format"
LEXICAL_FORMAT = 1

#: Candidate payloads a warm embedded store keeps per field set (EdgeStore._payloads):
#: about 1 KB each without the chunk text, so ~20 MB at most.
PAYLOAD_CACHE_POINTS = 20_000

#: Payload fields indexed up front: (name, kind). `tenant` is the tenant key. Only fields that
#: filters use: every index is loaded on each open of the embedded shard (each adds to a one-shot
#: search's open), so e.g. `content_hash` (read by the indexer, never filtered on) has none.
PAYLOAD_INDEXES: tuple[tuple[str, str], ...] = (
    ("tenant", "tenant"),
    ("repo", "keyword"),
    ("path", "keyword"),
    ("run_id", "keyword"),
    ("trust_class", "keyword"),
    ("language", "keyword"),
    ("expires_at", "float"),
    ("symbols", "keyword"),  # `rag symbols`: an exact lookup of a defined name, never a scan of chunk text
)


# ---------------------------------------------------------------- filters ---


@dataclass(frozen=True)
class Match:
    key: str
    value: str | int | bool


@dataclass(frozen=True)
class MatchAny:
    key: str
    values: tuple[str, ...]


@dataclass(frozen=True)
class Range:
    key: str
    gt: float | None = None
    gte: float | None = None
    lt: float | None = None
    lte: float | None = None


@dataclass(frozen=True)
class Where:
    """A boolean filter: all of `must`, none of `must_not`, at least one of `should` (if any)."""

    must: tuple[Any, ...] = ()
    must_not: tuple[Any, ...] = ()
    should: tuple[Any, ...] = ()


@dataclass
class SparseVec:
    indices: list[int]
    values: list[float]


@dataclass
class PointIn:
    id: str
    dense: np.ndarray | array[float]  # the stores read it with .tolist(); built points carry an array('f')
    sparse: SparseVec
    payload: dict[str, Any]


@dataclass
class SearchSpec:
    """One branch of a batched search: dense or sparse, with its filter and limit."""

    where: Where
    limit: int
    dense: np.ndarray | None = None
    sparse: SparseVec | None = None
    #: also score every hit of this branch against this dense query vector (`Hit.cosine`).
    #: Why not return the stored vectors: the engine rescoring its own candidates is one
    #: cheap batched request, where shipping 256 floats per hit to Python is not.
    cosine_to: np.ndarray | None = None
    #: likewise, every hit's BM25 score for this sparse query (`Hit.bm25`; 0 when no term matches)
    bm25_to: SparseVec | None = None
    #: payload keys to return; None = the whole payload. Why a field list: candidates only
    #: need what fusion reads; full payloads (chunk text included) are fetched for the final
    #: top_k alone, with `Store.retrieve`.
    fields: tuple[str, ...] | None = None


@dataclass
class Hit:
    id: str
    score: float
    payload: dict[str, Any]
    #: the hit's cosine similarity to `SearchSpec.cosine_to`, when the branch asked for it
    cosine: float | None = None
    #: the hit's BM25 score for `SearchSpec.bm25_to`, when the branch asked for it
    bm25: float | None = None


@dataclass
class TermTable:
    """A repository's BM25 statistics: how many canonical chunks it has, and in how many of them each term occurs.

    `ids` are sorted term ids, `counts[i]` the document frequency of `ids[i]`; `version` names
    the state of the repository's chunks it was counted from (`lexstats`).
    """

    version: str
    docs: int
    ids: Sequence[int]
    counts: Sequence[int]


@dataclass
class FileTable:
    """A repository's canonical chunks per file: the content hash they were all cut from, their ids,
    and the file's stat when it was read (size, mtime and ctime in ns, inode; None: not recorded).

    What an index run reads to tell unchanged files from changed ones, without reading back every
    chunk's payload; `version` is the repository's term table's (`lexstats`): the metadata names it
    only while the stored chunks are exactly these, so a run that was cut short leaves none named.
    """

    version: str
    files: dict[str, tuple[str, list[str], tuple[int, int, int, int] | None]]


@dataclass
class CollectionInfo:
    name: str
    dimensions: int
    model: str | None
    schema_version: int | None
    points: int
    extra: dict[str, Any] = field(default_factory=dict)


class Store(Protocol):
    collection: str

    def info(self) -> CollectionInfo | None: ...

    def create(self, dimensions: int, model: str, schema_version: int) -> None: ...

    def set_metadata(self, **meta: Any) -> None: ...

    def upsert(self, points: Sequence[PointIn]) -> None: ...

    def room(self) -> int | None:
        """Points `upsert` takes before one of its writes builds a segment, in this process, for
        seconds and hundreds of MB (None: writes never do; a server builds its segments itself)."""
        ...

    def delete(self, where: Where) -> None: ...

    def delete_ids(self, ids: Sequence[str]) -> None: ...

    def search(self, specs: Sequence[SearchSpec], deadline: float | None = None) -> list[list[Hit]]:
        """`deadline` (time.monotonic) bounds the call, retries included: a latency budget."""
        ...

    def retrieve(self, ids: Sequence[str], fields: Sequence[str] | bool = True) -> list[Hit]: ...

    def vectors(self, ids: Sequence[str]) -> dict[str, list[float]]:
        """The stored dense vectors of these points (missing ids are left out): what `rag related` searches by."""
        ...

    def scroll(self, where: Where | None, fields: Sequence[str] | bool, batch: int = 1024) -> Iterator[Hit]: ...

    def sparse_terms(self, where: Where | None = None, ids: Sequence[str] | None = None) -> Iterator[list[int]]:
        """The term ids of each stored sparse vector, of the points with these `ids` or else matching `where`."""
        ...

    def read_term_table(self, key: str, version: str) -> TermTable | None:
        """The term table stored for `key` at exactly `version` (None when there is none)."""
        ...

    def write_term_table(self, key: str, table: TermTable) -> None:
        """Store `key`'s table durably, replacing its other versions."""
        ...

    def read_file_table(self, key: str, version: str) -> FileTable | None:
        """The file table stored for `key` at exactly `version` (None when there is none)."""
        ...

    def write_file_table(self, key: str, table: FileTable) -> None:
        """Store `key`'s file table durably, replacing its other versions (a store may keep none: then read gives None)."""
        ...

    def count(self, where: Where | None = None) -> int: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...

    # -- after an index run, and the atomic switch of `rag sync-embedding` --------------------
    def optimize(self) -> None:
        """Make what was written fast to search (the embedded engine builds its index; a server does it itself)."""
        ...

    def alias_target(self) -> str | None:
        """The physical collection this name points at, or None when it holds its data itself."""
        ...

    def sibling(self, name: str) -> "Store":
        """Another collection beside this one (a sync target), reached the same way."""
        ...

    def release(self) -> None:
        """Let other processes use the store while this one works on a sibling (no-op where nothing is held)."""
        ...

    def switch_alias(self, target: str, wait_s: float = 30.0) -> str | None:
        """Point this name at `target` atomically; the old physical name, or None."""
        ...

    def drop_physical(self, name: str | None) -> None:
        """Delete data no name points at any more."""
        ...

    def has_physical(self, name: str | None) -> bool:
        """Whether data that `drop_physical(name)` would delete is there (what an interrupted sync left)."""
        ...


class EmbeddedStore(Store, Protocol):
    """What only the in-process engine has: one owning process, which may hold it for good."""

    def hold(self, wait_s: float | None = None) -> Path: ...

    @property
    def holding(self) -> bool: ...


def _fields(fields: Sequence[str] | bool) -> list[str] | bool:
    return fields if isinstance(fields, bool) else list(fields)


def _rescorings(s: SearchSpec) -> list[tuple[str, np.ndarray | None, SparseVec | None]]:
    """The extra scores a branch asked for: (Hit field, dense query, sparse query)."""
    out: list[tuple[str, np.ndarray | None, SparseVec | None]] = []
    if s.cosine_to is not None:
        out.append(("cosine", s.cosine_to, None))
    if s.bm25_to is not None:
        out.append(("bm25", None, s.bm25_to))
    return out


def _refuse_if_expired(deadline: float | None) -> None:
    if deadline is not None and time.monotonic() >= deadline:
        raise MoonmindError(
            "latency_budget_exceeded",
            "The latency budget was spent before the search could start.",
            "Raise budgets.latency_ms or retry when the service is less loaded.",
        )


def _missing(collection: str) -> MoonmindError:
    return MoonmindError(
        "collection_missing",
        f"Collection {collection} does not exist yet.",
        "Run `moonmind rag index PATH --repo NAME` to create and fill it.",
    )
