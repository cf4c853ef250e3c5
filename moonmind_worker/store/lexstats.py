"""Each repository's BM25 statistics, so that a search's scores depend only on the repositories it searches.

Why: Qdrant's IDF modifier counts every point of the collection, so indexing repository Y
changed the scores and the order of a search scoped to X. Instead the sparse vectors carry
term-frequency weights only (`text.lexical.document_vector`); each repository keeps a term
table (how many canonical chunks it has, and in how many of them each term occurs), and a
search weighs its query terms by the IDF of the tables of the repositories in its scope, summed.
Overlay chunks are not counted: one run's uncommitted edits must not move every other run's scores.

Kept consistent with the points: the collection metadata `lexical_tables` names, per
repository, the version of its table, or None from an index run's first write to its last.
A run marks its repository None before it writes a point, stores the new table, then names
that version in the metadata write that ends the run. A run killed anywhere in between leaves
None, and a table marked None is counted again from the stored points themselves (the next run
of that repository stores it again). Collections made before this have no `lexical_format` and
keep the engine's IDF (`scoped` is False): `moonmind rag sync-embedding` rebuilds them.
"""

from __future__ import annotations

import uuid
import weakref
from bisect import bisect_left
from collections import Counter, OrderedDict
from threading import Lock
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from ..contracts import CANONICAL
from .base import LEXICAL_FORMAT, LEXICAL_FORMAT_KEY, CollectionInfo, Match, PointIn, Store, TermTable, Where

if TYPE_CHECKING:
    from ..contracts import RetrievalQuery
    from .scopes import Scope

#: Collection metadata: {"<tenant>/<repo>": {"tenant", "repo", "version": str | None}}.
TABLES_KEY = "lexical_tables"
#: Term tables a process keeps, by version (a version never changes, so an entry never goes stale).
CACHED_TABLES = 256

_tables: OrderedDict[str, TermTable] = OrderedDict()
_lock = Lock()
#: per store and key: (chunk count, the table counted from the points) while its repository is marked None
_live: weakref.WeakKeyDictionary[Any, dict[str, tuple[int, TermTable]]] = weakref.WeakKeyDictionary()


def scoped(info: CollectionInfo | None) -> bool:
    """Whether this collection keeps per-repository term tables (made by this version or a later one)."""
    return info is not None and info.extra.get(LEXICAL_FORMAT_KEY) == LEXICAL_FORMAT


def table_key(tenant: str, repo: str) -> str:
    return f"{tenant}/{repo}"


def _where(tenant: str, repo: str) -> Where:
    return Where(must=(Match("tenant", tenant), Match("repo", repo), Match("trust_class", CANONICAL)))


def tally(term_lists: Iterable[Sequence[int]]) -> tuple[int, Counter[int]]:
    """(documents, document frequency per term) of these sparse vectors' term ids."""
    counts: Counter[int] = Counter()
    docs = 0
    for terms in term_lists:
        counts.update(terms)
        docs += 1
    return docs, counts


def make_table(version: str, docs: int, counts: Counter[int]) -> TermTable:
    ids = sorted(t for t, n in counts.items() if n > 0)
    return TermTable(version=version, docs=docs, ids=ids, counts=[counts[t] for t in ids])


def count_repo(store: Store, tenant: str, repo: str, version: str = "") -> TermTable:
    """The repository's table counted from its stored canonical points (the repair path)."""
    docs, counts = tally(store.sparse_terms(_where(tenant, repo)))
    return make_table(version, docs, counts)


def entries(info: CollectionInfo | None) -> dict[str, dict[str, Any]]:
    return dict((info.extra.get(TABLES_KEY) if info else None) or {})


def in_scope(info: CollectionInfo | None, query: RetrievalQuery, scope: Scope | None = None) -> list[tuple[str, dict[str, Any]]]:
    """The repositories a search may reach: every one its tenant and repo filters and the allow-list keep."""
    f = query.filters
    out = []
    for key, e in sorted(entries(info).items()):
        if (f.tenant is not None and e.get("tenant") != f.tenant) or (f.repo is not None and e.get("repo") != f.repo):
            continue
        if scope is not None and (e.get("repo") not in scope.repos or e.get("tenant") not in scope.tenants):
            continue
        out.append((key, e))
    return out


def load(store: Store, key: str, entry: dict[str, Any]) -> TermTable:
    """The repository's current table: cached by version, else read, else counted from the points."""
    version = entry.get("version")
    tenant, repo = str(entry.get("tenant")), str(entry.get("repo"))
    if not version:  # an index run is writing this repository, or one was cut short
        count = store.count(_where(tenant, repo))
        with _lock:
            live = _live.setdefault(store, {})
            seen = live.get(key)
        if seen is not None and seen[0] == count:
            return seen[1]
        counted = count_repo(store, tenant, repo)
        with _lock:
            live[key] = (count, counted)
        return counted
    with _lock:
        cached = _tables.get(version)
        if cached is not None:
            _tables.move_to_end(version)
            return cached
    table = store.read_term_table(key, version)
    if table is None:  # named but not there (a sync's new collection, a lost file): the points say the same
        table = count_repo(store, tenant, repo, version)
    with _lock:
        _tables[version] = table
        while len(_tables) > CACHED_TABLES:
            _tables.popitem(last=False)
    return table


def frequencies(store: Store, info: CollectionInfo | None, query: RetrievalQuery, scope: Scope | None,
                term_ids: Sequence[int]) -> tuple[int, list[int]]:
    """(documents, document frequency of each term) summed over the repositories in the search's scope."""
    docs = 0
    df = [0] * len(term_ids)
    for key, entry in in_scope(info, query, scope):
        table = load(store, key, entry)
        docs += table.docs
        ids, counts, n = table.ids, table.counts, len(table.ids)
        for i, term in enumerate(term_ids):
            at = bisect_left(ids, term)
            if at < n and ids[at] == term:
                df[i] += counts[at]
    return docs, df


class RunTable:
    """One index run's repository table: kept up to date as the run replaces, adds and drops points.

    Why as it goes, not counted at the end: an incremental run touches a few files, and reading
    back every chunk of the repository to count it would cost more than the run.
    """

    def __init__(self, store: Store, info: CollectionInfo | None, tenant: str, repo: str) -> None:
        self.store, self.tenant, self.repo = store, tenant, repo
        self.key = table_key(tenant, repo)
        self.active = info is None or scoped(info)  # None: the run creates the collection, in this format
        old = entries(info).get(self.key) or {}
        self.old_version: str | None = old.get("version") if self.active else None
        self.docs = 0
        self.counts: Counter[int] | None = None  # None: counted from the points at the end
        self.changed = False
        self.version: str | None = None  # what `finish` named
        if self.old_version:
            table = load(store, self.key, old)
            self.docs, self.counts = table.docs, Counter(dict(zip(table.ids, table.counts)))
        elif self.active and not old and (info is None or store.count(_where(tenant, repo)) == 0):
            self.counts = Counter()  # nothing stored yet: counted as it is written

    def begin(self) -> dict[str, Any]:
        """The metadata that marks the table as being rewritten: written before the run's first point."""
        return self._meta(None) if self.active else {}

    def replacing(self, ids: Sequence[str]) -> None:
        """Before these stored points are overwritten or deleted: their terms leave the table."""
        if not self.active or not ids:
            return
        self.changed = True
        if self.counts is not None:
            docs, gone = tally(self.store.sparse_terms(ids=ids))
            self.docs -= docs
            self.counts.subtract(gone)

    def adding(self, points: Sequence[PointIn]) -> None:
        if not self.active or not points:
            return
        self.changed = True
        if self.counts is not None:
            docs, new = tally(p.sparse.indices for p in points)
            self.docs += docs
            self.counts.update(new)

    def finish(self) -> dict[str, Any]:
        """Store the table, then return the metadata that names its version (written by the run's last write)."""
        if not self.active:
            return {}
        if self.old_version and not self.changed:
            self.version = self.old_version
            return self._meta(self.old_version)
        version = self.version = uuid.uuid4().hex
        if self.counts is None:
            table = count_repo(self.store, self.tenant, self.repo, version)
        else:
            table = make_table(version, self.docs, self.counts)
        self.store.write_term_table(self.key, table)
        with _lock:
            _tables[version] = table
        return self._meta(version)

    def _meta(self, version: str | None) -> dict[str, Any]:
        # read again: another repository's run may have named its own table since this one started
        current = entries(self.store.info())
        current[self.key] = {"tenant": self.tenant, "repo": self.repo, "version": version}
        return {TABLES_KEY: current}


def rebuild_all(store: Store, tenants_repos: Iterable[tuple[str, str]]) -> dict[str, Any]:
    """Count and store the table of each of these repositories from `store`'s points; the metadata naming them."""
    current: dict[str, Any] = {}
    for tenant, repo in sorted(set(tenants_repos)):
        key = table_key(tenant, repo)
        table = count_repo(store, tenant, repo, uuid.uuid4().hex)
        store.write_term_table(key, table)
        current[key] = {"tenant": tenant, "repo": repo, "version": table.version}
    return {TABLES_KEY: current, LEXICAL_FORMAT_KEY: LEXICAL_FORMAT}
