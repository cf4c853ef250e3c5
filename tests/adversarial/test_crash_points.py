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
import re
import shutil
import signal
import subprocess
import time
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
    for i in range(12, 24):  # enough new chunks for several writes (indexer.WRITE_POINTS each)
        (root / f"pkg/m{i}.py").write_text(_module(i, 120, "v2"))
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


def _table_drift(home: Path, engine: str) -> str | None:
    """How the repository's stored BM25 term table differs from a count of its stored points (None: it does not)."""
    from moonmind_worker.settings import Settings
    from moonmind_worker.store import lexstats, open_store

    settings = Settings(_env_file=None, moonmind_home=home, qdrant_url=str(home / "local-qdrant") if engine == "local" else None)
    store = open_store(settings)
    try:
        version = (lexstats.entries(store.info()).get(f"{TENANT}/{REPO}") or {}).get("version")
        stored = store.read_term_table(f"{TENANT}/{REPO}", version) if version else None
        counted = lexstats.count_repo(store, TENANT, REPO)
    finally:
        store.close()
    if stored is None:
        return f"no table named (version {version!r})"
    if (stored.docs, list(stored.ids), list(stored.counts)) != (counted.docs, list(counted.ids), list(counted.counts)):
        return f"{stored.docs} documents and {len(stored.ids)} terms stored, {counted.docs} and {len(counted.ids)} counted"
    return None


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
        drift = _table_drift(home, engine)
        if torn:
            failures.append(f"{op}#{n}:{when}: {len(torn)} torn files, e.g. {torn[:3]}")
        elif drift:
            failures.append(f"{op}#{n}:{when}: BM25 term table: {drift}")
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


def _children(pid: int) -> set[int]:
    """The processes `pid` started (Linux /proc): its index workers and their resource tracker."""
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out.update(int(c) for c in (task / "children").read_text().split())
        except OSError:
            pass
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


PROGRESS = re.compile(r"^progress: (\d+)/(\d+) files \(\d+%\), (\d+) chunks")
EXIT_BY_SIGNAL = {signal.SIGINT: 130, signal.SIGTERM: -signal.SIGTERM, signal.SIGKILL: -signal.SIGKILL}


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=lambda s: s.name)
def test_an_index_stopped_by_a_signal_mid_run_keeps_what_it_finished_and_the_next_run_resumes(sig, tmp_path):
    """Issue 20: a real `moonmind rag index` (worker processes and all) gets SIGINT, SIGTERM or SIGKILL
    with a write stored and more in flight. Its workers die with it; the next run skips the
    files it finished by hash, writes the rest, says it resumed, never that the chunking changed,
    and leaves every file whole."""
    from moonmind_worker.indexing.indexer import WRITE_POINTS

    root, home = tmp_path / "tree", tmp_path / "home"
    (root / "pkg").mkdir(parents=True)
    files = 150
    for i in range(files):  # ~4,500 chunks of 200 characters: ~4 writes
        (root / f"pkg/m{i}.py").write_text(_module(i, 30, "v1"))
    env = _env(home, "edge", MOONMIND_INDEX_WORKERS="2", MOONMIND_PROGRESS_INTERVAL_S="0.02")
    args = ["rag", "index", str(root), "--repo", REPO, "--tenant", TENANT]
    proc = subprocess.Popen([MOONMIND, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen, workers = [], set()
    for text in proc.stderr:
        seen.append(text)
        workers |= _children(proc.pid)
        m = PROGRESS.match(text)
        if m and int(m.group(3)) >= WRITE_POINTS + 256:  # written + waiting for a batch: a write is in
            break
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert seen and PROGRESS.match(seen[-1]), f"the run ended before the signal: {''.join(seen)[-500:]}{err[-500:]}"
    assert int(PROGRESS.match(seen[-1]).group(1)) < files, "every file was read before the signal: not mid-run"
    assert proc.returncode == EXIT_BY_SIGNAL[sig], (proc.returncode, err[-500:])
    if sig == signal.SIGINT:
        assert err.rstrip().endswith("interrupted") and "Traceback" not in err, err[-500:]
    assert workers, "the run started no worker processes"
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in workers if _alive(p)], "worker processes outlived the index run"

    again = _run(_env(home, "edge"), *args)
    assert again.returncode == 0, again.stderr
    counts = re.search(rf": {files} files seen = (\d+) indexed \+ (\d+) unchanged \+ 0 skipped; 0 deleted; (\d+) chunks written",
                       again.stdout)
    assert counts, again.stdout
    resumed, kept, written = map(int, counts.groups())
    assert kept >= 2 and resumed >= 1 and resumed + kept == files, again.stdout  # finished files skipped by hash
    assert "resumed a run that was cut short" in again.stdout
    assert "re-chunked" not in again.stdout and "chunking changed" not in again.stdout
    stored = _store_files(home, "edge")
    assert _torn(stored, root, [f"pkg/m{i}.py" for i in range(files)]) == []
    assert 0 < written < sum(len(chunks) for chunks in stored.values())  # only what was left is written again


def _workers_of(pid: int) -> list[int]:
    """Its index worker processes (not multiprocessing's resource tracker)."""
    out = []
    for child in _children(pid):
        try:
            cmd = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if b"spawn_main" in cmd:
            out.append(child)
    return out


@pytest.mark.slow  # two index runs of ~4,500 chunks, one of them partly in a single process
def test_a_worker_killed_mid_run_costs_nothing_but_time(tmp_path):
    """A worker that dies (the OOM killer, a stray kill) takes its jobs with it: the run does them in
    its own process and finishes, every file whole, with the same points as a run nobody disturbed."""
    root, home = tmp_path / "tree", tmp_path / "home"
    (root / "pkg").mkdir(parents=True)
    files = 150  # a run long enough (~4,500 chunks) for the kill to land while the workers embed
    for i in range(files):
        (root / f"pkg/m{i}.py").write_text(_module(i, 30, "v1"))
    env = _env(home, "edge", MOONMIND_INDEX_WORKERS="2", MOONMIND_PROGRESS_INTERVAL_S="0.02")
    args = ["rag", "index", str(root), "--repo", REPO, "--tenant", TENANT, "--json"]
    proc = subprocess.Popen([MOONMIND, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed = None
    for text in proc.stderr:
        workers = _workers_of(proc.pid)
        m = PROGRESS.match(text)
        if workers and m and int(m.group(3)) >= 300:
            killed = workers[0]
            os.kill(killed, signal.SIGKILL)
            break
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()  # a hung run (see workers._unstick) fails the test, and is not left running
        raise
    assert killed, "no worker was seen mid-run"
    assert proc.returncode == 0, err[-800:]
    report = json.loads(out)
    assert report["files_indexed"] == files and report["resumed"] is False
    stored = _store_files(home, "edge")
    assert _torn(stored, root, [f"pkg/m{i}.py" for i in range(files)]) == []
    assert report["worker_died"] is True  # said, not hidden
    undisturbed = tmp_path / "home-2"
    r = _run(_env(undisturbed, "edge", MOONMIND_INDEX_WORKERS="0"), *args)
    assert r.returncode == 0 and json.loads(r.stdout)["chunks_written"] == report["chunks_written"]
    assert json.loads(r.stdout)["worker_died"] is False


def _varied_tree(root: Path, files: int, functions: int) -> None:
    """Functions of ~1,000 characters that do not repeat (one chunk each), reproducibly."""
    import random

    rng = random.Random(1)
    words = [f"{a}_{b}" for a in ("load", "parse", "emit", "fold", "scan", "merge", "split", "route", "cache", "index")
             for b in ("row", "key", "node", "page", "span", "blob", "tree", "slot")]
    (root / "pkg").mkdir(parents=True)
    for i in range(files):
        text = ""
        for j in range(functions):
            body = "".join(f"    {rng.choice(words)}_{k} = {rng.choice(words)}(x, {rng.randint(0, 999)}, '{rng.choice(words)}')\n"
                           for k in range(22))
            text += f'def f{i}_{j}(x):\n    """Function {j} of module {i}: {" ".join(rng.sample(words, 8))}."""\n{body}    return x\n\n\n'
        (root / f"pkg/m{i}.py").write_text(text)


@pytest.mark.slow  # two index runs of 6,000 chunks, one in a memory cgroup
def test_a_cold_index_in_a_memory_limit_too_small_for_its_workers_finishes_in_its_own_process(tmp_path):
    """A container that cannot hold the run's workers: the kernel's OOM killer takes a worker, not the
    indexing process (which, the largest, it otherwise picks: the run died), and the run finishes
    with every chunk and says so. This tree peaks at ~215 MiB with two workers and ~125 MiB
    without (the group's charge, page cache included); the limit sits between."""
    from bench.index_limit import MemoryGroup

    root = tmp_path / "tree"
    _varied_tree(root, files=200, functions=30)
    args = ["rag", "index", str(root), "--repo", REPO, "--tenant", TENANT]  # the line a user reads

    def env(home: Path, workers: str) -> dict[str, str]:
        e = _env(home, "edge", MOONMIND_INDEX_WORKERS=workers)
        e.pop("MOONMIND_CHUNK_CHARS")  # the default chunk size: the figures above are its
        return e

    try:
        group = MemoryGroup(limit_mib=170)
    except OSError as e:
        pytest.skip(f"no memory cgroup can be made here (root, or a delegated cgroup, needed): {e}")
    try:
        limited = subprocess.run(group.join_argv([MOONMIND, *args]), env=env(tmp_path / "home", "2"),
                                 capture_output=True, text=True, timeout=180)
        oom_kills = group.oom_kills()
    finally:
        group.remove()
    assert oom_kills >= 1, "the limit was never reached: the test no longer tests a limit"
    assert limited.returncode == 0, (limited.returncode, limited.stderr[-800:])
    assert "an index worker died (out of memory, killed, or could not start) and the run went on in this process" in limited.stdout
    assert _torn(_store_files(tmp_path / "home", "edge"), root, [f"pkg/m{i}.py" for i in range(200)]) == []
    free = _run(env(tmp_path / "home-2", "0"), *args)
    assert free.returncode == 0 and "an index worker died" not in free.stdout

    def written(out: str) -> str:
        return re.search(r"(\d+) chunks written", out).group(1)  # type: ignore[union-attr]

    assert written(limited.stdout) == written(free.stdout)
