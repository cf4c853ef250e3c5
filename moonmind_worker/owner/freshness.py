"""Keep what the owner indexed from local trees fresh, and say when a search may be answering from old text.

* The registry (`index-roots.json` under MOONMIND_HOME): each `rag index` run records the tree it
  read for a repository, so an owner started later knows what to watch.
* `Freshness`: in the process that owns the store, one `watchfiles` watcher per tree; what it
  sees change (after a quiet moment) is re-indexed by the same operation as `rag index`, for those
  paths alone (`index_repository(paths=...)`: same batches, same crash-consistency).
* `annotate`: a search's pack says `freshness` and `stale_paths`, with a note, from the watcher's
  pending changes where a watcher follows the tree, else from a bounded check: the hits' own files
  (stat, then hash when newer than the index run) and, in a long-lived process, at most every
  CHECK_EVERY_S a sample of the tree's first CHECK_FILES files.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import stat
import threading
import time
from pathlib import Path
from typing import Any, Iterable

from ..text.files import WalkRules

log = logging.getLogger("moonmind.owner.freshness")
# one INFO line per batch of changes from the library itself would flood the owner's log
logging.getLogger("watchfiles").setLevel(logging.WARNING)

REGISTRY = "index-roots.json"
#: The settings of a run that decide what its tree's files become, recorded with it: the watcher's
#: passes take them, so a tree keeps what it was indexed with (catalogs, secret files, redaction).
RECORDED_SWITCHES = ("index_catalogs", "index_secret_files", "redact_secrets")
#: A watcher hands its changes on once the tree has been quiet this long (the debounce)...
QUIET_MS = 300
#: ...or this long after the first of them, whichever comes first (a tree that never stops changing).
MAX_WAIT_MS = 5000
#: The bounded check where nothing watches a tree: how many of its files, and how often per tree.
CHECK_FILES = 2000
CHECK_EVERY_S = 10.0
#: How many changed paths a pack lists (its note says how many there are).
LISTED = 20

_current: dict[str, Freshness | None] = {"freshness": None}


# --------------------------------------------------------------- registry ---


def _registry(settings: Any) -> Path:
    return Path(settings.moonmind_home) / REGISTRY


def entries(settings: Any) -> list[dict[str, Any]]:
    """The trees indexed into this store's collection: root, repo, tenant, when, and the chunking used."""
    if not settings.embedded_store:
        return []
    try:
        data = json.loads(_registry(settings).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    rows = data.get("roots") if isinstance(data, dict) else None
    return [r for r in rows or [] if isinstance(r, dict) and r.get("collection") == settings.collection
            and all(isinstance(r.get(k), str) for k in ("root", "repo", "tenant"))]


def indexed(settings: Any, root: Path, repo: str, tenant: str, started: float) -> None:
    """Record that `root` was indexed as repo/tenant (run started at `started`); a watching owner follows it."""
    if not settings.embedded_store:
        return  # a Qdrant server has no owner here to keep it fresh
    path = _registry(settings)
    try:
        st = os.stat(root.resolve())
        identity: list[int] | None = [st.st_dev, st.st_ino]  # what root_problem checks the root against
    except OSError:
        identity = None
    row = {"collection": settings.collection, "tenant": tenant, "repo": repo, "root": str(root.resolve()),
           "root_identity": identity,
           "indexed_at": started, "chunk_chars": settings.chunk_chars, "chunk_overlap_lines": settings.chunk_overlap_lines,
           **{name: getattr(settings, name) for name in RECORDED_SWITCHES}}
    key = (settings.collection, tenant, repo)
    try:
        _rewrite(path, "roots", lambda rows: [*(r for r in rows if (r.get("collection"), r.get("tenant"), r.get("repo")) != key), row])
        # a new index of the tree is what its owner asked for: a job's past edits in it are no longer held back
        if any(r["root"] == row["root"] and r.get("released_at") is not None for r in job_trees(settings)):
            _rewrite(_claims_file(settings), "trees", lambda rows: [r for r in rows if r.get("root") != row["root"]
                                                                     or r.get("released_at") is None])
    except OSError as exc:
        log.warning("could not record %s as the tree of repo %s (%s): it is not watched", root, repo, exc)
        return
    current = _current["freshness"]
    if current is not None:
        current.follow()


def root_problem(row: dict[str, Any]) -> str | None:
    """Why the directory recorded in `row` is not the tree that was indexed there any more (None: it is).

    Why: the owner re-indexes recorded trees by themselves (at its start, on every watched change); a
    root that another user replaced by a link (or by another directory) would have the owner index
    what the link leads to, which the user who indexed the root may never have been able to read.
    """
    root = row["root"]
    try:
        st = os.lstat(root)
    except OSError as exc:
        return f"it cannot be read ({exc.strerror or type(exc).__name__})"
    if stat.S_ISLNK(st.st_mode):
        return "it was replaced by a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory any more"
    if os.path.realpath(root) != root:
        return "a directory on its path was replaced by a symbolic link"
    identity = row.get("root_identity")
    if isinstance(identity, list) and identity != [st.st_dev, st.st_ino]:
        return "another directory stands where it was (its device and inode differ from those indexed)"
    return None


class RootMoved(Exception):
    """A recorded tree is not re-indexed: its root is not the directory that was indexed (`root_problem`)."""


def _rewrite(path: Path, key: str, change: Any) -> None:
    """Read-modify-write the JSON list `key` of the file at `path` under its lock (`change`: rows -> rows)."""
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may record its own meanwhile
        try:
            rows = json.loads(path.read_text(encoding="utf-8")).get(key) or []
        except (OSError, ValueError, AttributeError):
            rows = []
        rows = change([r for r in rows if isinstance(r, dict)])
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({key: rows}, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # readers see the old file or the new one, never half of one


# ------------------------------------------------------------- job trees ---
# A job works in a tree the owner may watch (the documented flow: the repository indexed, then a job run
# in it). What the job changes there is its run's, not the tenant's: while the job holds the tree, the
# watcher writes those changes to the run's overlay (as `rag overlay upsert` would), and once the job is
# done the tree is held back from canonical passes until `rag index` of it says what it should hold.

JOB_TREES = "job-trees.json"
#: How long a job's watched edits stay in its overlay (as `rag overlay upsert`'s default); `job finish` removes them.
JOB_OVERLAY_TTL = "24h"


def _claims_file(settings: Any, create: bool = False) -> Path:
    """Where the job-tree record lives (with `create`: its directory, MOONMIND_HOME, made private first)."""
    if create:
        from .trust import ensure_private_dirs

        ensure_private_dirs(settings.moonmind_home)
    return Path(settings.moonmind_home) / JOB_TREES


def job_trees(settings: Any) -> list[dict[str, Any]]:
    """The trees jobs hold: root, run_id, repo, tenant, job_id, claimed_at, released_at (None while the job runs)."""
    try:
        data = json.loads(_claims_file(settings).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    rows = data.get("trees") if isinstance(data, dict) else None
    return [r for r in rows or [] if isinstance(r, dict) and all(isinstance(r.get(k), str) for k in ("root", "run_id", "repo", "tenant"))]


def hold_tree(settings: Any, root: Path, *, run_id: str, repo: str, tenant: str, job_id: str = "") -> None:
    """Record that the job of `run_id` works in `root`: the watcher sends what changes there to that run's overlay."""
    if not settings.embedded_store:
        return  # no owner here watches a tree for a Qdrant server
    row = {"root": str(root.resolve()), "run_id": run_id, "repo": repo, "tenant": tenant, "job_id": job_id,
           "claimed_at": time.time(), "released_at": None}
    _rewrite(_claims_file(settings, create=True), "trees",
             lambda rows: [*(r for r in rows if (r.get("root"), r.get("run_id")) != (row["root"], run_id)), row])


def release_trees(settings: Any, run_id: str) -> None:
    """The job of `run_id` is done: the trees it held stay held back from canonical passes (its edits may remain)."""
    if not settings.embedded_store:
        return
    now = time.time()
    watched = {r["root"] for r in entries(settings)}

    def release(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        rows = [{**r, "released_at": now} if r.get("run_id") == run_id and r.get("released_at") is None else r for r in rows]
        # a finished job's tree matters only while an owner would index it: one row per such tree is enough
        running = [r for r in rows if r.get("released_at") is None]
        left = {r.get("root"): r for r in rows if r.get("released_at") is not None and r.get("root") in watched}
        return running + list(left.values())

    if _claims_file(settings).exists():  # no job ever held a tree here: nothing to release
        _rewrite(_claims_file(settings), "trees", release)


# ---------------------------------------------------------------- watcher ---


class _Tree:
    """One watched tree: what its watcher saw change and whether the owner has caught up with it."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.pending: set[str] = set()
        self.running: set[str] = set()
        self.full = True  # a whole (incremental) pass first: it may have changed while nobody watched
        self.passing: str | None = None  # the pass running now: "whole" or "paths"
        self.ready = False  # caught up once: from then on its pending changes say what is stale
        self.watch_error: str | None = None  # no watcher follows it (searches check its files instead)
        self.pass_error: str | None = None  # its last pass failed (the next change tries again)
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None


class Freshness:
    """The owner's watchers and the one thread that re-indexes what they saw change."""

    def __init__(self, settings: Any, run: Any) -> None:
        self.settings = settings
        self._run = run  # ops.run, given by the server: ops reads this module's state
        self.watching = settings.watch == "on"
        self.trees: dict[str, _Tree] = {}
        self.passes = 0
        self._cond = threading.Condition()
        self._stopped = False
        self._worker: threading.Thread | None = None
        self._samples: dict[str, tuple[float, float, set[str]]] = {}  # root → (checked at, indexed at, changed)
        # the store's and the cached packs' own writes are no change to a tree that holds them
        self._own = [Path(settings.moonmind_home).resolve(), Path(settings.artifacts_root).resolve()]

    def start(self) -> Freshness:
        _current["freshness"] = self
        if self.watching:
            self._worker = threading.Thread(target=self._work, name="moonmind-freshness", daemon=True)
            self._worker.start()
            self.follow()
        return self

    def stop(self, timeout_s: float) -> None:
        """Stop watching; a pass in flight finishes first (bounded), so the store is let go between writes."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        for tree in list(self.trees.values()):
            tree.stop.set()
        if self._worker is not None:
            self._worker.join(timeout_s)
            if self._worker.is_alive():
                log.warning("stopping with a re-index pass still running after %.0f s: the next pass finishes it", timeout_s)
        if _current["freshness"] is self:
            _current["freshness"] = None

    def follow(self) -> None:
        """Watch every recorded tree not watched yet (called at start and after each index run)."""
        if not self.watching:
            return
        rows = entries(self.settings)
        for root in sorted({r["root"] for r in rows}):
            problem = next((p for r in rows if r["root"] == root and (p := root_problem(r))), None)
            if problem is not None:
                if root not in self.trees:
                    log.warning("not watching %s: %s. Index it again (rag index) if it is the tree you mean", root, problem)
                continue
            with self._cond:
                if self._stopped or root in self.trees or not os.path.isdir(root):
                    continue
                tree = self.trees[root] = _Tree(root)
                self._cond.notify_all()
            tree.thread = threading.Thread(target=self._watch, args=(tree,), name="moonmind-watch", daemon=True)
            tree.thread.start()
            log.info("watching %s: changed files are re-indexed (MOONMIND_WATCH=off turns this off)", root)

    def state(self) -> dict[str, Any]:
        with self._cond:
            return {
                "watch": "on" if self.watching else "off",
                "passes": self.passes,
                "trees": [{"root": t.root, "ready": t.ready, "error": t.watch_error or t.pass_error, "passing": t.passing,
                           "pending": len(t.pending) + len(t.running) + (1 if t.full else 0)} for t in self.trees.values()],
            }

    def stale(self, root: str) -> set[str] | None:
        """The paths of `root` changed and not re-indexed yet; None when no healthy watcher follows it."""
        with self._cond:
            tree = self.trees.get(root)
            if tree is None or not tree.ready or tree.full or tree.passing == "whole" or tree.watch_error or tree.pass_error:
                return None
            return tree.pending | tree.running

    def sample(self, root: str, since: float) -> set[str]:
        """`_sample_tree`, at most every CHECK_EVERY_S per tree (and again once the tree is indexed anew)."""
        with self._cond:
            hit = self._samples.get(root)
        now = time.monotonic()
        if hit is not None and now - hit[0] < CHECK_EVERY_S and hit[1] == since:
            return hit[2]
        changed = _sample_tree(root, since, self._rules(root)) if os.path.isdir(root) else set()
        with self._cond:
            self._samples[root] = (now, since, changed)
        return changed

    # -- watching -----------------------------------------------------------
    def _watch(self, tree: _Tree) -> None:
        import watchfiles

        try:
            for changes in watchfiles.watch(
                tree.root, watch_filter=lambda _change, path: self._worth_a_look(tree.root, path),
                debounce=MAX_WAIT_MS, step=QUIET_MS, stop_event=tree.stop, rust_timeout=0,
                raise_interrupt=False, ignore_permission_denied=True,
            ):
                self._saw(tree, changes)
        except Exception as exc:  # noqa: BLE001 - no watcher (inotify limits, a gone tree): searches check instead
            with self._cond:
                tree.watch_error = f"{type(exc).__name__}: {exc}"
            log.warning("cannot watch %s (%s): searches check its files instead", tree.root, tree.watch_error)

    def _rules(self, root: str) -> WalkRules:
        """What the runs that indexed `root` walked: catalogs or secret files when any of them took those (recorded)."""
        rows = [r for r in entries(self.settings) if r["root"] == root]
        return WalkRules(catalogs=any(r.get("index_catalogs") == "on" for r in rows),
                         secret_files=any(r.get("index_secret_files") == "on" for r in rows))

    def _worth_a_look(self, root: str, path: str) -> bool:
        """Cheap rules first (in the watcher's thread, per event): skipped directories and types, the store itself.

        Catalogs pass (`_saw` reads whether this tree's runs index them, once per batch of changes)."""
        from ..text.files import SKIP_DIRS, skipped_type

        rel = os.path.relpath(path, root)
        parts = rel.split(os.sep)
        if rel.startswith("..") or any(p in SKIP_DIRS or p.endswith(".egg-info") for p in parts[:-1]):
            return False
        if skipped_type(parts[-1], catalogs=True) is not None:
            return False
        return not any(Path(path).is_relative_to(own) for own in self._own)

    def _saw(self, tree: _Tree, changes: Iterable[tuple[Any, str]]) -> None:
        from watchfiles import Change

        from ..text.files import excluded_reason

        root = Path(tree.root)
        rules = self._rules(tree.root)
        ignore_rules: dict = {}  # each directory's ignore rules read once for the whole batch
        full, rels = False, set()
        for change, path in changes:
            rel = Path(os.path.relpath(path, root)).as_posix()
            if rel.startswith("..") or rel == ".":
                continue
            is_dir = os.path.isdir(path) and not os.path.islink(path)
            if rel.rsplit("/", 1)[-1] == ".gitignore" or (is_dir and change == Change.added):
                full = True  # which files are in the tree changed: the whole (incremental) pass decides
            elif not is_dir and excluded_reason(root, rel, rules=rules, cache=ignore_rules) is None:
                rels.add(rel)
        if full or rels:
            with self._cond:
                tree.pending |= rels
                tree.full |= full
                self._cond.notify_all()

    # -- re-indexing ----------------------------------------------------------
    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._stopped and not any(t.full or t.pending for t in self.trees.values()):
                    self._cond.wait()
                if self._stopped:
                    return
                tree = next(t for t in self.trees.values() if t.full or t.pending)
                paths = None if tree.full else sorted(tree.pending)
                tree.running, tree.pending, tree.full = tree.pending, set(), False
                tree.passing = "whole" if paths is None else "paths"
            failed: str | None = None
            try:
                self._pass(tree, paths)
            except Exception as exc:  # noqa: BLE001 - logged; the next change tries again, searches check meanwhile
                failed = str(getattr(exc, "message", "") or exc) or type(exc).__name__
                log.warning("re-indexing %s failed (%s): searches check its files until a pass succeeds", tree.root, failed)
            with self._cond:
                tree.running, tree.passing = set(), None
                tree.pass_error = failed
                tree.ready = tree.ready or failed is None
                self.passes += 1
                self._cond.notify_all()

    def _pass(self, tree: _Tree, paths: list[str] | None) -> None:
        """One re-index of `tree` for each repository indexed from it, through the same operation as `rag index`;
        for a tree a job holds, its run's overlay instead (`_job_pass`)."""
        rows = [row for row in entries(self.settings) if row["root"] == tree.root]
        for row in rows:
            problem = root_problem(row)  # checked before every pass: the root may have been swapped since the last
            if problem is not None:
                raise RootMoved(f"{tree.root} is not re-indexed: {problem}. Index it again (rag index) if it is the "
                                "tree you mean")
        held = [c for c in job_trees(self.settings) if c["root"] == tree.root]
        if held:
            self._job_pass(tree, paths, held)
            return
        for row in rows:
            update: dict[str, Any] = {k: row[k] for k in ("chunk_chars", "chunk_overlap_lines") if isinstance(row.get(k), int)}
            update.update({k: row[k] for k in RECORDED_SWITCHES if row.get(k) in ("on", "off")})
            settings = self.settings.model_copy(update=update)
            args: dict[str, Any] = {"path": tree.root, "repo": row["repo"], "tenant": row["tenant"]}
            if paths is not None:
                args["paths"] = paths
            report = self._run("index", args, settings)
            log.info("re-indexed %s (repo %s, %s): %d changed, %d deleted, %d chunks written, %.2f s",
                     tree.root, row["repo"], "whole tree" if paths is None else f"{len(paths)} changed paths",
                     report["files_indexed"], report["files_deleted"], report["chunks_written"], report["seconds"])

    def _job_pass(self, tree: _Tree, paths: list[str] | None, held: list[dict[str, Any]]) -> None:
        """What changed in a tree a job holds goes to that job's run overlay, never to the canonical index.

        A whole pass (the watch's start, a new directory, a .gitignore) takes every file modified since the job
        took the tree. Once the job is done, or when two jobs hold one tree (whose edit is whose?), nothing is
        written: the tree waits for `rag index`.
        """
        running = [c for c in held if c.get("released_at") is None]
        if len(running) != 1:
            why = "the jobs that held it are done" if not running else f"{len(running)} jobs hold it"
            log.info("not re-indexing %s: %s, so what changed there is theirs (rag index of it takes it in)", tree.root, why)
            return
        job = running[0]
        if paths is None:
            since = float(job.get("claimed_at") or 0)
            paths = sorted(_changed_since(tree.root, since, self._rules(tree.root)))
        if not paths:
            return
        args = {"paths": [os.path.join(tree.root, p) for p in paths], "root": tree.root, "run_id": job["run_id"],
                "repo": job["repo"], "tenant": job["tenant"], "ttl": JOB_OVERLAY_TTL}
        report = self._run("overlay_upsert", args, self.settings)
        log.info("%s is held by run %s: %d changed paths to its overlay (%d files, %d tombstones)", tree.root,
                 job["run_id"], len(paths), len(report.get("files", [])), len(report.get("tombstones", [])))


def _changed_since(root: str, since: float, rules: WalkRules, limit: int | None = None) -> set[str]:
    """The files of the tree (as `rules` walk it; the first `limit` of them) modified after `since`."""
    from itertools import islice

    from ..text.files import walk

    out = set()
    for rel, path in islice(walk(Path(root), rules=rules), limit):
        try:
            st = os.stat(path)
        except OSError:
            continue
        if max(st.st_mtime, st.st_ctime) > since:
            out.add(rel)
    return out


def current() -> Freshness | None:
    return _current["freshness"]


def state(settings: Any, args: dict[str, Any], progress: Any = None) -> dict[str, Any]:
    """The `freshness` operation: this process's watchers and how many passes they ran."""
    fresh = current()
    return fresh.state() if fresh is not None else {"watch": "none", "passes": 0, "trees": []}


# ----------------------------------------------------------------- search ---


def annotate(pack: Any, settings: Any) -> Any:
    """`pack` with `freshness`, `stale_paths` and a note, for the repositories its canonical hits come from."""
    rows = {(r["tenant"], r["repo"]): r for r in entries(settings)}
    if not rows:
        return pack
    hits: dict[tuple[str, str], list[Any]] = {}
    for item in pack.items:
        if item.trust_class == "canonical":  # an overlay item is the run's own text, never stale
            hits.setdefault((item.payload.get("tenant"), item.payload.get("repo")), []).append(item)
    stale: set[str] = set()
    checked, watched, unwatched = False, False, []
    fresh = current()
    for key, items in hits.items():
        row = rows.get(key)
        if row is None:
            continue
        checked = True
        root, since = row["root"], float(row.get("indexed_at") or 0)
        stale |= {i.source for i in items if _changed(Path(root), i.source, i.content_hash, since, settings.max_file_bytes)}
        pending = fresh.stale(root) if fresh is not None else None
        if pending is not None:
            watched = True
            stale |= pending
        else:
            unwatched.append(row)
            if fresh is not None:  # a long-lived process: the bounded sample, at most every CHECK_EVERY_S
                stale |= fresh.sample(root, since)
    if not checked:
        return pack
    notes = list(pack.notes)
    if stale:
        shown = sorted(stale)[:LISTED]
        listing = ", ".join(shown) + (f" and {len(stale) - len(shown)} more" if len(stale) > len(shown) else "")
        if watched and not unwatched:
            notes.append(f"{len(stale)} changed file(s) not re-indexed yet ({listing}): this answer may hold their old "
                         "text; the owner is re-indexing them")
        else:
            how = "; ".join(f"moonmind rag index {r['root']} --repo {r['repo']} --tenant {r['tenant']}" for r in unwatched)
            notes.append(f"{len(stale)} file(s) changed since they were indexed ({listing}): this answer may hold their "
                         f"old text. Re-index ({how}), or let an owner watch the tree (MOONMIND_WATCH=on)")
    return pack.model_copy(update={"freshness": "stale" if stale else "fresh", "stale_paths": sorted(stale)[:LISTED],
                                   "notes": notes})


def _changed(root: Path, rel: str, content_hash: str, since: float, max_bytes: int) -> bool:
    """Whether the file a hit was cut from differs from it now: gone, or newer than the run and of other content."""
    try:
        st = os.stat(root / rel)
    except OSError:
        return True
    if max(st.st_mtime, st.st_ctime) <= since:
        return False
    from ..indexing.indexer import content_hash as hash_of
    from ..text.files import read_text

    text, _ = read_text(root / rel, max_bytes)
    return text is None or hash_of(text) != content_hash


def _sample_tree(root: str, since: float, rules: WalkRules = WalkRules()) -> set[str]:
    """Files among the tree's first CHECK_FILES (walk order, as `rules` walk) modified after `since`: the bounded check."""
    return _changed_since(root, since, rules, CHECK_FILES)
