"""qdrant-client: a Qdrant server or cluster (QDRANT_URL), or the client's local mode.

Collection metadata is recorded in Qdrant's own collection metadata. Every call goes
through one retry/auth wrapper (`QdrantClientStore._call`).
"""

from __future__ import annotations

import math
import threading
import time
from typing import TYPE_CHECKING, Any, Iterator, Sequence

if TYPE_CHECKING:
    import numpy as np

from ..errors import MoonmindError, redact
from ..settings import Settings
from .base import (
    DENSE,
    DENSE_SEARCH_BEAM,
    LEXICAL_FORMAT,
    LEXICAL_FORMAT_KEY,
    PAYLOAD_INDEXES,
    SPARSE,
    CollectionInfo,
    FileTable,
    Hit,
    Match,
    MatchAny,
    PointIn,
    Range,
    SearchSpec,
    SparseVec,
    TermTable,
    Where,
    _fields,
    _refuse_if_expired,
    _rescorings,
)

# ---------------------------------------------------------- qdrant-client ---


class QdrantClientStore:
    """A Qdrant server or cluster (QDRANT_URL=http(s)://…), or qdrant-client's local mode (`:memory:` or a path)."""

    _client: Any  # a qdrant_client.QdrantClient, imported when a store is made
    local: bool
    location: str
    _has_key: bool
    _local_lock: Any  # a lock in local mode (one client per path), else a no-op context
    _path: str | None = None  # local mode on a path that holds nothing yet: opened by the first `create`

    def __init__(self, settings: Settings, collection: str, *, share: "QdrantClientStore | None" = None) -> None:
        """`share`: another store whose client this one uses (a sync target: local mode allows one client per path)."""
        from qdrant_client import QdrantClient

        self.collection = collection
        self._settings = settings
        if share is not None:
            self._client, self.local, self.location = share._client, share.local, share.location
            self._has_key, self._local_lock = share._has_key, share._local_lock
            self._physical = True  # created as itself, never behind an alias
            self._shared = True  # close() leaves the shared client open
            return
        url = settings.qdrant_url or ":memory:"
        key = settings.qdrant_api_key.get_secret_value() if settings.qdrant_api_key else None
        self.local = not url.lower().startswith(("http://", "https://"))
        if url == ":memory:":
            self._client = QdrantClient(location=":memory:")
        elif not self.local:
            import warnings

            with warnings.catch_warnings():  # "api key over http" is the operator's choice; keep stderr clean
                warnings.simplefilter("ignore", UserWarning)
                self._client = QdrantClient(
                    url=url, api_key=key, timeout=int(max(settings.qdrant_timeout_s, 1)), check_compatibility=False
                )
        else:
            import os

            path = os.path.expanduser(url[len("file://"):] if url.lower().startswith("file://") else url)
            if os.path.lexists(path):
                self._client = _local_client(path)
            else:
                # nothing stored there yet: an empty stand-in answers every read (no collection) without
                # creating the directory, which only the first write (`create`) does (a search must
                # leave no store behind)
                self._client = QdrantClient(location=":memory:")
                self._path = path
        self.location = url
        self._has_key = key is not None
        self._physical = False  # True for a sync target: created as itself, never behind an alias
        self._shared = False  # True for a sibling sharing this client: close() leaves the client open
        # local mode is a pure-Python engine that is not thread-safe (a delete during a query's
        # scan fails inside it): calls on it are serialized; a server handles concurrency itself
        self._local_lock = threading.RLock() if self.local else None

    def _call(self, fn, what: str, deadline: float | None = None):
        from ..retry import call_with_retries

        if self._local_lock is not None:
            inner, fn = fn, lambda: self._locked(inner)
        try:
            return call_with_retries(
                fn, what=f"{what} at {redact(self.location)}", service="qdrant", deadline=deadline
            )
        except MoonmindError as err:
            raise _explain_auth(err, self._has_key) from None

    def _locked(self, fn):
        with self._local_lock:
            return fn()

    def info(self) -> CollectionInfo | None:
        name: str | None = self.collection
        if not self._call(lambda: self._client.collection_exists(name), "Qdrant"):
            name = self.alias_target()  # a server may not resolve aliases in `exists`
            if name is None or not self._call(lambda: self._client.collection_exists(name), "Qdrant"):
                return None
        c = self._call(lambda: self._client.get_collection(name), "Qdrant")
        params = c.config.params.vectors
        dims = params[DENSE].size if isinstance(params, dict) else params.size
        meta = dict(getattr(c.config, "metadata", None) or {})
        return CollectionInfo(
            name=self.collection,
            dimensions=int(dims),
            model=meta.get("model"),
            schema_version=meta.get("schema_version"),
            points=int(c.points_count or 0),
            extra=meta,
        )

    def create(self, dimensions: int, model: str, schema_version: int) -> None:
        """A physical collection behind an alias named `collection`, so sync-embedding can switch atomically."""
        from qdrant_client import models as m

        if self._path is not None:  # local mode: the path is created now, by the first write
            with self._local_lock:
                self._client.close()
                self._client, self._path = _local_client(self._path), None
        # every call through _call: retried when transient, a 401/403 explained like every other operation
        physical = self.collection if self._physical else (self.alias_target() or f"{self.collection}__v1")
        if self._call(lambda: self._client.collection_exists(physical), "Qdrant"):
            self._call(lambda: self._client.delete_collection(physical), "Qdrant delete collection")
        self._drop_tables(physical)  # the counts of the points just dropped
        if physical != self.collection and self._call(lambda: self._client.collection_exists(self.collection), "Qdrant"):
            # a plain collection from an older version
            self._call(lambda: self._client.delete_collection(self.collection), "Qdrant delete collection")
        self._call(lambda: self._client.create_collection(
            physical,
            vectors_config={DENSE: m.VectorParams(size=dimensions, distance=m.Distance.COSINE)},
            # no IDF modifier: the engine's would count every repository in the collection (see lexstats)
            sparse_vectors_config={SPARSE: m.SparseVectorParams()},
            metadata={"dimensions": dimensions, "model": model, "schema_version": schema_version,
                      LEXICAL_FORMAT_KEY: LEXICAL_FORMAT},
        ), "Qdrant create collection")
        if physical != self.collection and self.alias_target() != physical:
            alias = m.CreateAliasOperation(create_alias=m.CreateAlias(collection_name=physical, alias_name=self.collection))
            self._call(lambda: self._client.update_collection_aliases(change_aliases_operations=[alias]), "Qdrant alias")
        if self.local:
            return  # local mode has no payload indexes (it only warns); a server gets them all
        for name, kind in PAYLOAD_INDEXES:
            self._call(lambda n=name, f=_index_schema(kind): self._client.create_payload_index(physical, n, field_schema=f),
                       "Qdrant payload index")

    def set_metadata(self, **meta: Any) -> None:
        name = self.alias_target() or self.collection
        self._call(lambda: self._client.update_collection(name, metadata=meta), "Qdrant metadata")

    # -- aliases (sync-embedding) -------------------------------------------
    def alias_target(self) -> str | None:
        """The physical collection this name is an alias of, or None."""
        resp = self._call(lambda: self._client.get_aliases(), "Qdrant aliases")
        return next((a.collection_name for a in resp.aliases if a.alias_name == self.collection), None)

    def sibling(self, name: str) -> "QdrantClientStore":
        """A physical collection on the same client (local mode allows one client per path)."""
        return QdrantClientStore(self._settings, name, share=self)

    def release(self) -> None:
        """A server serves other clients meanwhile; nothing to release."""

    def switch_alias(self, target: str, wait_s: float = 30.0) -> str | None:
        """Re-point the alias at `target` in one atomic alias update; the old physical name, or None.

        `wait_s` is the embedded store's wait for its lock; a server orders alias updates itself,
        so there is nothing to wait for here (the call is retried like every other).
        """
        from qdrant_client import models as m

        old = self.alias_target()
        ops: list[Any] = []
        if old is not None:
            ops.append(m.DeleteAliasOperation(delete_alias=m.DeleteAlias(alias_name=self.collection)))
        elif self._call(lambda: self._client.collection_exists(self.collection), "Qdrant"):
            # a plain collection from an older version: the name must be freed before it can become an alias
            self._call(lambda: self._client.delete_collection(self.collection), "Qdrant delete collection")
        ops.append(m.CreateAliasOperation(create_alias=m.CreateAlias(collection_name=target, alias_name=self.collection)))
        self._call(lambda: self._client.update_collection_aliases(change_aliases_operations=ops), "Qdrant alias switch")
        return old

    def drop_physical(self, name: str | None) -> None:
        """Delete a collection no alias points at any more."""
        if name and name != self.alias_target():
            self._call(lambda: self._client.delete_collection(name), "Qdrant delete collection")
            self._drop_tables(name)

    def has_physical(self, name: str | None) -> bool:
        """Whether a collection no alias points at is there (a plain one is deleted before its name becomes an alias)."""
        if not name or name == self.alias_target():
            return False
        return bool(self._call(lambda: self._client.collection_exists(name), "Qdrant"))

    def upsert(self, points: Sequence[PointIn]) -> None:
        from qdrant_client import models as m

        if not points:
            return
        batch = [
            m.PointStruct(
                id=p.id,
                vector={
                    DENSE: p.dense.tolist(),
                    SPARSE: m.SparseVector(indices=p.sparse.indices, values=p.sparse.values),
                },
                payload=p.payload,
            )
            for p in points
        ]
        self._call(lambda: self._client.upsert(self.collection, points=batch, wait=True), "Qdrant upsert")

    def delete(self, where: Where) -> None:
        from qdrant_client import models as m

        self._call(
            lambda: self._client.delete(
                self.collection, points_selector=m.FilterSelector(filter=_client_filter(where)), wait=True
            ),
            "Qdrant delete",
        )

    def delete_ids(self, ids: Sequence[str]) -> None:
        from qdrant_client import models as m

        if ids:
            self._call(
                lambda: self._client.delete(
                    self.collection, points_selector=m.PointIdsList(points=list(ids)), wait=True
                ),
                "Qdrant delete",
            )

    def search(self, specs: Sequence[SearchSpec], deadline: float | None = None) -> list[list[Hit]]:
        """Bounded by `deadline`: Qdrant's own search timeout plus the retry policy's stop."""
        from qdrant_client import models as m

        _refuse_if_expired(deadline)
        # a server walks its graph as the embedded store does (base.DENSE_SEARCH_BEAM); local mode scans
        # every point exactly and warns that search parameters do nothing there
        wide = None if self.local else m.SearchParams(hnsw_ef=DENSE_SEARCH_BEAM)

        def beam(s: SearchSpec) -> Any:
            return wide if s.dense is not None else None

        requests: list[Any] = []
        plan: list[tuple[int, dict[str, int]]] = []
        for s in specs:
            query, using = _client_query(s.dense, s.sparse)
            flt = _client_filter(s.where)
            main, rescored = len(requests), dict[str, int]()
            requests.append(
                m.QueryRequest(
                    query=query, using=using, filter=flt, limit=s.limit, params=beam(s),
                    with_payload=list(s.fields) if s.fields is not None else True, with_vector=False,
                )
            )
            for score_field, dense, sparse in _rescorings(s):  # the same candidates, rescored (see SearchSpec)
                rescored[score_field] = len(requests)
                other, other_using = _client_query(dense, sparse)
                requests.append(
                    m.QueryRequest(
                        prefetch=m.Prefetch(query=query, using=using, filter=flt, limit=s.limit, params=beam(s)),
                        query=other, using=other_using, limit=s.limit, with_payload=False, with_vector=False,
                    )
                )
            plan.append((main, rescored))
        extra = {}
        if deadline is not None:  # Qdrant takes whole seconds; the pipeline enforces the exact budget after
            extra["timeout"] = max(1, math.ceil(deadline - time.monotonic()))
        responses = self._call(
            lambda: self._client.query_batch_points(self.collection, requests=requests, **extra),
            "Qdrant query",
            deadline=deadline,
        )
        out = []
        for main, rescored in plan:
            cos, bm25 = ({str(p.id): float(p.score) for p in responses[rescored[f]].points} if f in rescored else None
                         for f in ("cosine", "bm25"))
            out.append([
                Hit(id=str(p.id), score=float(p.score), payload=dict(p.payload or {}),
                    cosine=None if cos is None else cos.get(str(p.id), 0.0),
                    bm25=None if bm25 is None else bm25.get(str(p.id), 0.0))
                for p in responses[main].points
            ])
        return out

    def retrieve(self, ids: Sequence[str], fields: Sequence[str] | bool = True) -> list[Hit]:
        """Points by id with the payload fields asked for, in the order asked; missing ids are skipped."""
        if not ids:
            return []
        records = self._call(
            lambda: self._client.retrieve(self.collection, ids=list(ids), with_payload=_fields(fields), with_vectors=False),
            "Qdrant retrieve",
        )
        by_id = {str(r.id): r for r in records}
        return [Hit(id=i, score=0.0, payload=dict(by_id[i].payload or {})) for i in ids if i in by_id]

    def vectors(self, ids: Sequence[str]) -> dict[str, list[float]]:
        if not ids:
            return {}
        records = self._call(
            lambda: self._client.retrieve(self.collection, ids=list(ids), with_payload=False, with_vectors=[DENSE]),
            "Qdrant retrieve",
        )
        return {str(r.id): list(r.vector[DENSE] if isinstance(r.vector, dict) else r.vector) for r in records}

    def scroll(self, where: Where | None, fields: Sequence[str] | bool, batch: int = 1024) -> Iterator[Hit]:
        offset = None
        flt = _client_filter(where) if where else None
        with_payload = list(fields) if not isinstance(fields, bool) else fields
        while True:
            records, offset = self._call(
                lambda: self._client.scroll(
                    self.collection, scroll_filter=flt, limit=batch, offset=offset, with_payload=with_payload,
                    with_vectors=False,
                ),
                "Qdrant scroll",
            )
            for r in records:
                yield Hit(id=str(r.id), score=0.0, payload=dict(r.payload or {}))
            if offset is None:
                break

    def sparse_terms(self, where: Where | None = None, ids: Sequence[str] | None = None) -> Iterator[list[int]]:
        if ids is not None:
            for start in range(0, len(ids), 1024):
                some = list(ids[start:start + 1024])
                records = self._call(
                    lambda: self._client.retrieve(self.collection, ids=some, with_payload=False, with_vectors=[SPARSE]),
                    "Qdrant retrieve",
                )
                for r in records:
                    yield _indices(r.vector)
            return
        offset = None
        flt = _client_filter(where) if where else None
        while True:
            records, offset = self._call(
                lambda: self._client.scroll(
                    self.collection, scroll_filter=flt, limit=1024, offset=offset, with_payload=False, with_vectors=[SPARSE],
                ),
                "Qdrant scroll",
            )
            for r in records:
                yield _indices(r.vector)
            if offset is None:
                break

    def _tables(self) -> str:
        """The collection beside the physical one that holds its term tables (it follows sync-embedding's switch)."""
        return f"{self.alias_target() or self.collection}{TERM_TABLES}"

    def _drop_tables(self, physical: str) -> None:
        name = f"{physical}{TERM_TABLES}"
        if self._call(lambda: self._client.collection_exists(name), "Qdrant"):
            self._call(lambda: self._client.delete_collection(name), "Qdrant delete collection")

    def read_term_table(self, key: str, version: str) -> TermTable | None:
        name = self._tables()
        if not self._call(lambda: self._client.collection_exists(name), "Qdrant"):
            return None
        records = self._call(
            lambda: self._client.retrieve(name, ids=[_table_id(key)], with_payload=True, with_vectors=[TABLE_VECTOR]),
            "Qdrant retrieve",
        )
        if not records or (records[0].payload or {}).get("version") != version:
            return None
        counts = (records[0].vector or {}).get(TABLE_VECTOR)
        ids, values = (list(counts.indices), list(counts.values)) if counts is not None else ([], [])
        return TermTable(version=version, docs=int(records[0].payload["docs"]), ids=ids, counts=[int(v) for v in values])

    def write_term_table(self, key: str, table: TermTable) -> None:
        """One point per key in the tables' collection: the counts as a sparse vector, the version in its payload."""
        from qdrant_client import models as m

        name = self._tables()
        if not self._call(lambda: self._client.collection_exists(name), "Qdrant"):
            self._call(lambda: self._client.create_collection(
                name, vectors_config={}, sparse_vectors_config={TABLE_VECTOR: m.SparseVectorParams()},
            ), "Qdrant create collection")
        point = m.PointStruct(
            id=_table_id(key), payload={"key": key, "version": table.version, "docs": table.docs},
            vector={TABLE_VECTOR: m.SparseVector(indices=list(table.ids), values=[float(c) for c in table.counts])},
        )
        self._call(lambda: self._client.upsert(name, points=[point], wait=True), "Qdrant upsert")

    def read_file_table(self, key: str, version: str) -> FileTable | None:
        """None: a server keeps none (an index run reads the chunks' paths and hashes from it, in pages)."""
        return None

    def write_file_table(self, key: str, table: FileTable) -> None:
        """Nothing: the table spares a new process reading the embedded store's payloads from disk; a server answers the scroll itself."""

    def count(self, where: Where | None = None) -> int:
        flt = _client_filter(where) if where else None
        return self._call(
            lambda: self._client.count(self.collection, count_filter=flt, exact=True).count, "Qdrant count"
        )

    def room(self) -> int | None:
        """A server builds its segments in its own process, and local mode keeps no segments: a write here never builds one."""
        return None

    def optimize(self) -> None:
        """A server optimizes in the background; an older collection gains the payload indexes it lacks (`symbols`)."""
        if self.local:
            return  # local mode has no payload indexes
        physical = self.alias_target() or self.collection
        have = self._call(lambda: self._client.get_collection(physical), "Qdrant").payload_schema or {}
        for name, kind in PAYLOAD_INDEXES:
            if name not in have:
                self._call(lambda n=name, f=_index_schema(kind): self._client.create_payload_index(physical, n, field_schema=f),
                           "Qdrant payload index")

    def flush(self) -> None:
        """Writes use wait=True; nothing buffered."""

    def close(self) -> None:
        if not self._shared:
            self._client.close()


#: The suffix of the collection holding a physical collection's term tables, and their vector's name.
TERM_TABLES = "__term_tables"
TABLE_VECTOR = "df"


def _table_id(key: str) -> str:
    import uuid

    return str(uuid.uuid5(uuid.UUID("0d4c1e8a-5b7f-4a43-9a55-7465726d7462"), key))


def _indices(vector: Any) -> list[int]:
    """A record's sparse term ids (none when the point has no sparse vector: a text with no term)."""
    sparse = (vector or {}).get(SPARSE) if isinstance(vector, dict) else None
    return list(sparse.indices) if sparse is not None else []


def _index_schema(kind: str) -> Any:
    """A payload index's schema by kind (base.PAYLOAD_INDEXES)."""
    from qdrant_client import models as m

    return {
        "tenant": m.KeywordIndexParams(type=m.KeywordIndexType.KEYWORD, is_tenant=True),
        "keyword": m.PayloadSchemaType.KEYWORD,
        "float": m.PayloadSchemaType.FLOAT,
    }[kind]


def _local_client(path: str) -> Any:
    """qdrant-client's local mode on `path` (it creates the directory), or store_busy while another process has it."""
    from qdrant_client import QdrantClient

    try:
        return QdrantClient(path=path)
    except RuntimeError as exc:
        if "already accessed" not in str(exc):
            raise
        raise MoonmindError(
            "store_busy",
            f"The local Qdrant store {path} is in use by another process.",
            "Run searches through the worker or point QDRANT_URL at a Qdrant server.",
        ) from None


def _explain_auth(err: MoonmindError, has_key: bool) -> MoonmindError:
    """A 401 with no key configured is a missing credential: name the variable, not a bad key."""
    if err.code == "unauthenticated" and not has_key:
        return MoonmindError(
            "missing_credentials",
            f"{err.message} QDRANT_API_KEY is not set and this Qdrant server requires a key.",
            "Export QDRANT_API_KEY (read from the environment or a .env file in the working directory).",
            **err.details,
        )
    return err


def _client_filter(where: Where | None):
    from qdrant_client import models as m

    if where is None:
        return None

    def cond(c):
        if isinstance(c, Where):
            return _client_filter(c)
        if isinstance(c, Match):
            return m.FieldCondition(key=c.key, match=m.MatchValue(value=c.value))
        if isinstance(c, MatchAny):
            return m.FieldCondition(key=c.key, match=m.MatchAny(any=list(c.values)))
        if isinstance(c, Range):
            return m.FieldCondition(key=c.key, range=m.Range(gt=c.gt, gte=c.gte, lt=c.lt, lte=c.lte))
        raise TypeError(c)

    return m.Filter(
        must=[cond(c) for c in where.must] or None,
        must_not=[cond(c) for c in where.must_not] or None,
        should=[cond(c) for c in where.should] or None,
    )


def _client_query(dense: np.ndarray | None, sparse: SparseVec | None):
    """(query, using) for a qdrant-client QueryRequest."""
    from qdrant_client import models as m

    if dense is not None:
        return dense.tolist(), DENSE
    if sparse is None:
        raise ValueError("a search branch needs a dense or a sparse query")
    return m.SparseVector(indices=sparse.indices, values=sparse.values), SPARSE
