"""Crash at every store write point of a real index and overlay run; the next run leaves no file torn.

Issue 18 (major 2, and "make those runs part of the suite"): an exit between a batch's upsert and
its stale-chunk delete left files with chunks of two versions for good. Here a real `moonmind`
process is stopped with `os._exit` (no cleanup, no flush: what SIGKILL or a power cut does) just
before and just after each write it makes (`moonmind_worker/store/faults.py`), on both engines, and
the next plain run must leave every file whole: all of its chunks of its current version, none
missing, nothing of deleted files.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from moonmind_worker.store.faults import CRASH_EXIT

from conftest import _SCRUB, MOONMIND

pytestmark = pytest.mark.slow

REPO, TENANT, RUN = "torn", "acme", "run-1"


def _module(i: int, functions: int, version: str) -> str:
    return "".join(
        f'def f{i}_{j}(x):\n    """Function {j} of module {i}, {version}."""\n    y = x * {j}\n'
        f"    for k in range({j}):\n        y += k\n    return y\n\n\n"
        for j in range(functions)
    )


def _v1(root: Path) -> None:
    for i in range(36):
        (root / "pkg").mkdir(parents=True, exist_ok=True)
        (root / f"pkg/m{i}.py").write_text(_module(i, 12, "v1"))


def _v2(root: Path) -> None:
    """Shrink some files (stale chunks to delete), grow others, delete some, add some."""
    for i in range(0, 12):
        (root / f"pkg/m{i}.py").write_text(_module(i, 3, "v2"))
    for i in range(12, 24):  # enough new chunks for several write batches (256 chunks each)
        (root / f"pkg/m{i}.py").write_text(_module(i, 30, "v2"))
    for i in range(30, 36):
        (root / f"pkg/m{i}.py").unlink()
    for i in range(40, 44):
        (root / f"pkg/m{i}.py").write_text(_module(i, 6, "v2"))


def _env(home: Path, engine: str, **extra: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    e.update(MOONMIND_HOME=str(home), MOONMIND_OWNER="off", MOONMIND_CHUNK_CHARS="200")
    if engine == "local":
        e["QDRANT_URL"] = str(home / "local-qdrant")
    e.update(extra)
    return e


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([MOONMIND, *args], env=env, capture_output=True, text=True, timeout=180)


def _store_files(home: Path, engine: str, overlay: bool = False) -> dict[str, list[dict]]:
    """Every stored chunk of the scope (canonical, or the run's overlay), grouped by path (read in-process)."""
    from moonmind_worker.settings import Settings
    from moonmind_worker.store import Match, Where, open_store

    settings = Settings(_env_file=None, moonmind_home=home, qdrant_url=str(home / "local-qdrant") if engine == "local" else None)
    must = [Match("repo", REPO), Match("tenant", TENANT), Match("trust_class", "workspace_overlay" if overlay else "canonical")]
    if overlay:
        must.append(Match("run_id", RUN))
    store = open_store(settings)
    try:
        rows = [h.payload for h in store.scroll(Where(must=tuple(must)), ["path", "content_hash", "chunk_sequence", "total_chunks"])]
    finally:
        store.close()
    files: dict[str, list[dict]] = {}
    for row in rows:
        files.setdefault(row["path"], []).append(row)
    return files


def _points(ops: list[str]) -> list[tuple[str, int, str]]:
    """Before the first write, then after each: the store changes only at writes, so a crash just
    before write k+1 leaves exactly what a crash just after write k leaves."""
    seen: dict[str, int] = {}
    out = [(ops[0], 1, "before")]
    for op in ops:
        n = seen[op] = seen.get(op, 0) + 1
        out.append((op, n, "after"))
    return out


def _torn(files: dict[str, list[dict]], root: Path, paths: list[str]) -> list[str]:
    """Paths whose stored chunks are not exactly one complete copy of the file as it is now."""
    from moonmind_worker.indexing.indexer import content_hash

    bad = []
    for rel in sorted(set(files) | set(paths)):
        path = root / rel
        chunks = files.get(rel, [])
        if not path.exists():
            if chunks:
                bad.append(f"{rel}: {len(chunks)} chunks of a deleted file")
            continue
        want = content_hash(path.read_text())
        hashes = {c["content_hash"] for c in chunks}
        totals = {c["total_chunks"] for c in chunks}
        seqs = sorted(c["chunk_sequence"] for c in chunks)
        if hashes != {want} or len(totals) != 1 or seqs != list(range(next(iter(totals)))):
            bad.append(f"{rel}: versions {len(hashes)}, chunks {len(chunks)}, totals {sorted(totals)}")
    return bad


@pytest.fixture(scope="module", params=["edge", pytest.param("local", marks=pytest.mark.slow)])
def indexed_v1(request, tmp_path_factory):
    """The v1 tree indexed once (copied for every crash), and the list of v2's write points."""
    engine = request.param
    base = tmp_path_factory.mktemp(f"crash-{engine}")
    root = base / "tree"
    _v1(root)
    home = base / "home"
    r = _run(_env(home, engine), "rag", "index", str(root), "--repo", REPO, "--tenant", TENANT)
    assert r.returncode == 0, r.stderr
    # one traced v2 run on a copy: every write a real run makes, in order
    trace_home, trace_root = base / "trace-home", base / "trace-tree"
    shutil.copytree(home, trace_home)
    shutil.copytree(root, trace_root)
    _v2(trace_root)
    trace = base / "writes.txt"
    r = _run(_env(trace_home, engine, MOONMIND_FAULT_TRACE=str(trace)), "rag", "index", str(trace_root), "--repo", REPO, "--tenant", TENANT)
    assert r.returncode == 0, r.stderr
    ops = trace.read_text().split()
    assert ops.count("upsert") >= 2 and ops.count("delete_ids") >= 2, ops  # several batches, stale deletes
    return engine, base, root, home, ops


def test_a_crash_at_any_index_write_leaves_no_torn_file_after_the_next_run(indexed_v1):
    engine, base, root_v1, home_v1, ops = indexed_v1
    points = _points(ops)
    failures, survived = [], 0
    for k, (op, n, when) in enumerate(points):
        home, root = base / f"h{k}", base / f"t{k}"
        shutil.copytree(home_v1, home)
        shutil.copytree(root_v1, root)
        _v2(root)
        crashed = _run(_env(home, engine, MOONMIND_FAULT=f"{op}#{n}:{when}"), "rag", "index", str(root), "--repo", REPO, "--tenant", TENANT)
        if crashed.returncode != CRASH_EXIT:
            failures.append(f"{op}#{n}:{when}: the injected crash did not happen (exit {crashed.returncode}): {crashed.stderr[-300:]}")
            continue
        again = _run(_env(home, engine), "rag", "index", str(root), "--repo", REPO, "--tenant", TENANT, "--json")
        if again.returncode != 0:
            failures.append(f"{op}#{n}:{when}: the next run failed: {again.stderr[-300:]}")
            continue
        report = json.loads(again.stdout)
        if report.get("rechunked"):
            failures.append(f"{op}#{n}:{when}: the next run said every file was re-chunked")
        paths = [str(p.relative_to(root)) for p in root.rglob("*.py")]
        torn = _torn(_store_files(home, engine), root, paths)
        if torn:
            failures.append(f"{op}#{n}:{when}: {len(torn)} torn files, e.g. {torn[:3]}")
        else:
            survived += 1
        shutil.rmtree(home)
        shutil.rmtree(root)
    print(f"crash injection ({engine}, index): {len(points)} write points crashed, {survived} left no torn file")
    assert not failures, "\n".join(failures)
    assert survived == len(points) >= 7


def test_a_crash_at_any_overlay_write_leaves_no_torn_overlay_after_the_next_upsert(indexed_v1):
    engine, base, root_v1, home_v1, _ = indexed_v1
    home, root = base / "ov-home", base / "ov-tree"
    shutil.copytree(home_v1, home)
    shutil.copytree(root_v1, root)
    edited = [f"pkg/m{i}.py" for i in range(0, 8)]
    for rel in edited:  # the run's first overlay: many chunks per file
        (root / rel).write_text(_module(int(rel[5:-3]), 14, "overlay-1"))
    upsert = ["rag", "overlay", "upsert", *[str(root / p) for p in edited], "--root", str(root),
              "--run-id", RUN, "--repo", REPO, "--tenant", TENANT]
    assert _run(_env(home, engine), *upsert).returncode == 0
    for rel in edited:  # the second: fewer chunks, so the first one's extra chunks are stale
        (root / rel).write_text(_module(int(rel[5:-3]), 4, "overlay-2"))
    trace = base / "ov-writes.txt"
    probe_home = base / "ov-probe"
    shutil.copytree(home, probe_home)
    assert _run(_env(probe_home, engine, MOONMIND_FAULT_TRACE=str(trace)), *upsert).returncode == 0
    ops = trace.read_text().split()
    assert "upsert" in ops and "delete_ids" in ops, ops
    failures = []
    print(f"crash injection ({engine}, overlay): {len(_points(ops))} write points")
    for op, n, when in _points(ops):
        h = base / f"ov-{op}-{n}-{when}"
        shutil.copytree(home, h)
        crashed = _run(_env(h, engine, MOONMIND_FAULT=f"{op}#{n}:{when}"), *upsert)
        if crashed.returncode != CRASH_EXIT:
            failures.append(f"{op}#{n}:{when}: no crash (exit {crashed.returncode})")
            continue
        assert _run(_env(h, engine), *upsert).returncode == 0
        torn = _torn(_store_files(h, engine, overlay=True), root, edited)
        if torn:
            failures.append(f"{op}#{n}:{when}: {torn[:3]}")
        shutil.rmtree(h)
    assert not failures, "\n".join(failures)


def test_a_first_index_cut_short_resumes_without_re_chunking_what_it_finished(tmp_path):
    """Issue 20: Ctrl-C during the first index of a tree, then a re-run, re-embedded every chunk and
    said "every file re-chunked (chunking changed since the last run)" although nothing changed."""
    root, home = tmp_path / "tree", tmp_path / "home"
    _v1(root)
    for i in range(36, 60):  # several write batches
        (root / f"pkg/m{i}.py").write_text(_module(i, 30, "v1"))
    crashed = _run(_env(home, "edge", MOONMIND_FAULT="upsert#2:after"), "rag", "index", str(root), "--repo", REPO, "--tenant", TENANT)
    assert crashed.returncode == CRASH_EXIT
    again = _run(_env(home, "edge"), "rag", "index", str(root), "--repo", REPO, "--tenant", TENANT, "--json")
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert report["rechunked"] is False and "re-chunked" not in again.stderr
    assert report["files_unchanged"] > 0, "files the cut-short run finished are skipped by hash"
    paths = [str(p.relative_to(root)) for p in root.rglob("*.py")]
    assert _torn(_store_files(home, "edge"), root, paths) == []
