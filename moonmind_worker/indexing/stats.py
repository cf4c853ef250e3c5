"""What the index holds for one repository: chunks per file, and files no chunk represents.

Why: a file that was indexed but has no chunk, or only part
of its chunks, can never be retrieved, and nothing else would say so. Two
checks find such orphans:

* from the store alone: a file whose stored chunks do not form the complete
  sequence 0..total_chunks-1 of one file version (an interrupted write);
* with the tree (`--root`): files the indexer would index (readable text with
  content) that have no chunk at all, and stored files no longer on disk. As the
  indexer does, a stored file whose stat is the one its last index run recorded
  is that file (it has content), so it is not read again.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..contracts import CANONICAL
from ..embedding import Embedder
from ..errors import MoonmindError
from ..settings import Settings
from ..store import CollectionInfo, Store, lexstats
from ..store.base import Match, Where
from ..store.guardrails import check_collection
from ..store.scopes import canonical_repo
from ..text.chunking import chunk_text
from ..text.files import TreeReader, WalkRules, walk
from . import source as sources
from .indexer import SOURCES, named_file_table, stat_key


@dataclass
class FileStats:
    path: str
    chunks: int
    total_chunks: int
    language: str
    tokens: int
    complete: bool


@dataclass
class IndexStats:
    repo: str
    tenant: str | None
    files: list[FileStats]
    chunks: int
    incomplete: list[str] = field(default_factory=list)  # stored, but chunks missing
    unindexed: list[str] = field(default_factory=list)  # on disk (--root), no chunk stored
    stale: list[str] = field(default_factory=list)  # stored, no longer on disk (--root)
    root_checked: bool = False
    #: what the last index run read (indexing.source): a git commit, or files; None before sources were recorded
    source: dict | None = None

    @property
    def orphans(self) -> list[str]:
        """Files the index should represent but does not (fully)."""
        return sorted(set(self.incomplete) | set(self.unindexed))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["orphans"] = self.orphans
        return d


def collect_stats(
    *, repo: str, tenant: str | None, root: Path | None, settings: Settings, embedder: Embedder, store: Store
) -> IndexStats:
    info = check_collection(store, embedder)
    per_file: dict[str, dict] = {}
    tenants: set[str] = set()
    fields = ["path", "chunk_sequence", "total_chunks", "content_hash", "language", "token_count", "tenant"]
    for hit in store.scroll(canonical_repo(repo, tenant), fields):
        p = hit.payload
        tenants.add(p.get("tenant", ""))
        f = per_file.setdefault(
            p["path"], {"seqs": set(), "total": set(), "hashes": set(), "language": p.get("language", ""), "tokens": 0}
        )
        f["seqs"].add(p["chunk_sequence"])
        f["total"].add(p["total_chunks"])
        f["hashes"].add(p.get("content_hash"))
        f["tokens"] += int(p.get("token_count") or 0)

    files = []
    for path in sorted(per_file):
        f = per_file[path]
        total = max(f["total"])
        complete = len(f["total"]) == 1 and len(f["hashes"]) == 1 and f["seqs"] == set(range(total))
        files.append(FileStats(path, len(f["seqs"]), total, f["language"], f["tokens"], complete))
    stats = IndexStats(
        repo=repo,
        tenant=tenant,
        files=files,
        chunks=sum(f.chunks for f in files),
        incomplete=[f.path for f in files if not f.complete],
        source=recorded_source(info, repo, tenants.copy().pop() if len(tenants) == 1 else tenant),
    )
    if root is not None:
        stats.root_checked = True
        on_disk = set()
        known = _recorded_stats(store, info, repo, tenants.pop()) if len(tenants) == 1 else {}
        with TreeReader(Path(root).resolve()) as reader:
            for rel, _ in walk(root, rules=WalkRules.of(settings)):
                if rel in known and rel in per_file:
                    st = reader.stat(rel)
                    if st is not None and stat_key(st) == known[rel] and st.st_size <= settings.max_file_bytes:
                        on_disk.add(rel)
                        continue
                text, _ = reader.read_text(rel, settings.max_file_bytes)
                # whether it has chunks at all (a redacted secret leaves its marker: it never empties a text)
                if text is None or not chunk_text(text, rel, settings.chunk_chars, settings.chunk_overlap_lines, redact=False):
                    continue  # the indexer skips these too: not an orphan
                on_disk.add(rel)
        stats.unindexed = sorted(on_disk - set(per_file))
        stats.stale = sorted(set(per_file) - on_disk)
    return stats


def _recorded_stats(store: Store, info: CollectionInfo | None, repo: str, tenant: str) -> dict[str, tuple[int, int, int, int]]:
    """Path -> the stat the repository's last index run recorded, for files it stored chunks of (none without a table)."""
    key = lexstats.table_key(tenant, repo)
    version = (lexstats.entries(info).get(key) or {}).get("version") if lexstats.scoped(info) else None
    table = named_file_table(store, key, version, repo=repo, tenant=tenant)
    if table is None:
        return {}
    return {path: st for path, (_, ids, st) in table.files.items() if ids and st is not None}


def indexed_repos(store: Store, tenant: str | None = None) -> list[dict]:
    """Every repository with canonical chunks (in `tenant`, or every tenant): what `rag repos` lists.

    One scroll over the canonical points' small payload fields (no text, no vectors): files, chunks,
    the embedding model(s) and the newest `indexed_at`, per (repository, tenant).
    """
    info = store.info()
    must: tuple = (Match("trust_class", CANONICAL),) + ((Match("tenant", tenant),) if tenant else ())
    per: dict[tuple[str, str], dict] = {}
    for hit in store.scroll(Where(must=must), ["repo", "tenant", "path", "model_version", "indexed_at"]):
        p = hit.payload
        row = per.setdefault((str(p.get("repo", "")), str(p.get("tenant", ""))), {"paths": set(), "chunks": 0, "models": set(), "last": ""})
        row["paths"].add(p.get("path"))
        row["chunks"] += 1
        row["models"].add(str(p.get("model_version") or ""))
        row["last"] = max(row["last"], str(p.get("indexed_at") or ""))
    return [
        {"repo": repo, "tenant": t, "files": len(row["paths"]), "chunks": row["chunks"],
         "model": ", ".join(sorted(m for m in row["models"] if m)), "last_indexed": row["last"] or None,
         "source": recorded_source(info, repo, t)}
        for (repo, t), row in sorted(per.items())
    ]


def recorded_source(info: CollectionInfo | None, repo: str, tenant: str | None) -> dict | None:
    """What the last index run of (tenant, repo) was built from (indexing.source), or None when not recorded."""
    found = ((info.extra.get(SOURCES) if info else None) or {}).get(f"{tenant}/{repo}")
    return found if isinstance(found, dict) else None


def unknown_repo(repo: str, tenant: str | None, known: list[dict]) -> MoonmindError:
    """`rag stats` of a repository with no chunk (in `tenant`): a usage error that names the indexed ones."""
    where = f" in tenant {tenant!r}" if tenant else ""
    if not known:
        return MoonmindError("invalid_argument", f"No repository {repo!r} is indexed{where}: nothing is indexed yet.",
                             "Index it first: moonmind rag index PATH --repo NAME.")
    names = [f"{k['repo']} (tenant {k['tenant']})" for k in known[:20]]
    more = f", and {len(known) - 20} more" if len(known) > 20 else ""
    return MoonmindError(
        "invalid_argument", f"No repository {repo!r} is indexed{where}.",
        f"Indexed: {', '.join(names)}{more}. Pass one of them (`moonmind rag repos` lists them), "
        "or index it: moonmind rag index PATH --repo NAME.",
    )


def format_stats(stats: IndexStats) -> str:
    scope = f"repo={stats.repo}" + (f" tenant={stats.tenant}" if stats.tenant else "")
    lines = [f"{scope}: {len(stats.files)} files, {stats.chunks} chunks", f"source: {sources.summary(stats.source)}", ""]
    width = max([len(f.path) for f in stats.files] + [4])
    lines.append(f"{'file':<{width}}  {'chunks':>6}  {'tokens':>7}  language")
    for f in stats.files:
        mark = "" if f.complete else f"  INCOMPLETE ({f.chunks} of {f.total_chunks})"
        lines.append(f"{f.path:<{width}}  {f.chunks:>6}  {f.tokens:>7}  {f.language}{mark}")
    lines.append("")
    if stats.orphans:
        lines.append(f"orphaned files ({len(stats.orphans)}): indexed or indexable, but not fully represented by chunks")
        lines.extend(f"- {p}" for p in stats.orphans)
    else:
        checked = "every stored file is complete" + (" and every indexable file has chunks" if stats.root_checked else "")
        lines.append(f"orphaned files: none ({checked})")
    if stats.stale:
        lines.append(f"stale files ({len(stats.stale)}): stored but no longer on disk; re-run `moonmind rag index`")
        lines.extend(f"- {p}" for p in stats.stale)
    return "\n".join(lines) + "\n"
