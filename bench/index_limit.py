"""The smallest memory limit a cold `rag index` completes in: the memory it needs, not what it maps.

`python -m bench.index_limit [--source DIR] [--low MIB] [--high MIB] [--step MIB]` runs a real
`moonmind rag index DIR` into a scratch MOONMIND_HOME (MOONMIND_OWNER=off), first without a limit,
then bisecting a memory cgroup's limit (v2 `memory.max`, or v1 `memory.limit_in_bytes` where only
v1 is mounted) down to the smallest one the run completes in with every chunk written, to `--step`
MiB. Every process of the run is in the cgroup (the writer, its index workers, the resource
tracker), so the limit is what a container running `rag index` would have to allow.

Why this and not the summed RSS alone: RSS counts the file pages a process maps, and the engine maps
each built segment's indexes (loaded `Cached`), pages that are also the page cache of the files the
run just wrote. A cgroup is charged a page once, however many processes map it, and the kernel takes
clean file pages back when the group reaches its limit; what it cannot take back (no swap here) is
anonymous memory. So the summed RSS grows with the index written while the limit the run needs need
not: this measures the second. A run that needs more than its limit is killed by the kernel's OOM
killer (exit 137), which is how a failed step is told apart; the wall at the smallest limit shows
whether reclaiming cost it time.

Before each run the source tree is dropped from the page cache (`posix_fadvise(DONTNEED)` per file),
so every run reads it from disk as a first run does and is charged for it. Needs root (or a
delegated cgroup): it exits with a message saying so when it cannot create one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

V2 = Path("/sys/fs/cgroup")
V1 = Path("/sys/fs/cgroup/memory")


@dataclass
class Run:
    limit_mib: int | None
    ok: bool
    oom_killed: bool
    exit_code: int
    wall_s: float
    charged_peak_mib: float  # the cgroup's peak charge: anonymous memory and the page cache it touched
    chunks: int | None
    worker_died: bool  # the report's: an index worker was killed and the run went on in its own process


class MemoryGroup:
    """A fresh memory cgroup (v2 if the unified hierarchy has the memory controller, else v1)."""

    def __init__(self, limit_mib: int | None) -> None:
        name = f"moonmind-index-limit-{os.getpid()}-{time.monotonic_ns()}"
        self.v2 = "memory" in _read(V2 / "cgroup.controllers").split()
        self.path = (V2 if self.v2 else V1) / name
        self.path.mkdir()  # OSError where cgroups are not ours to make (not root, no delegation)
        limit = str(limit_mib * 1024 * 1024) if limit_mib else ("max" if self.v2 else "-1")
        (self.path / ("memory.max" if self.v2 else "memory.limit_in_bytes")).write_text(limit)
        if self.v2 and (self.path / "memory.swap.max").exists():  # swap would hide what the run needs
            (self.path / "memory.swap.max").write_text("0")

    def join_argv(self, argv: list[str]) -> list[str]:
        """argv run from a shell that first moves itself into the group (its children follow)."""
        return ["sh", "-c", f'echo $$ > {self.path / "cgroup.procs"} && exec "$@"', "sh", *argv]

    def peak_mib(self) -> float:
        f = "memory.peak" if self.v2 else "memory.max_usage_in_bytes"
        text = _read(self.path / f)
        return int(text) / 2**20 if text.strip().isdigit() else float("nan")

    def oom_kills(self) -> int:
        text = _read(self.path / ("memory.events" if self.v2 else "memory.oom_control"))
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def remove(self) -> None:
        for _ in range(50):  # the group empties once the run's last process is reaped
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def evict(tree: Path) -> None:
    """Drop the tree's files from the page cache, so the next run reads them from disk."""
    for root, _dirs, files in os.walk(tree):
        for name in files:
            try:
                fd = os.open(os.path.join(root, name), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def index_in_group(source: Path, limit_mib: int | None, workers: int | None = None) -> Run:
    """One cold `rag index` of `source`, every process of it in a fresh group limited to `limit_mib` (None: no limit)."""
    from .owner import MOONMIND

    evict(source)
    home = tempfile.mkdtemp(prefix="moonmind-index-limit-")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MOONMIND_", "QDRANT_"))}
    env.update(MOONMIND_HOME=home, MOONMIND_OWNER="off")
    if workers is not None:
        env["MOONMIND_INDEX_WORKERS"] = str(workers)
    group = MemoryGroup(limit_mib)
    try:
        started = time.perf_counter()
        p = subprocess.run(group.join_argv([MOONMIND, "rag", "index", str(source), "--repo", "bench", "--json"]),
                           env=env, capture_output=True, text=True)
        wall = time.perf_counter() - started
        try:
            report = json.loads(p.stdout)
        except ValueError:
            report = {}
        chunks = report.get("chunks_written")
        return Run(limit_mib, p.returncode == 0 and chunks is not None, group.oom_kills() > 0, p.returncode, wall,
                   group.peak_mib(), chunks, bool(report.get("worker_died")))
    finally:
        group.remove()
        shutil.rmtree(home, ignore_errors=True)


def _line(run: Run) -> str:
    limit = f"{run.limit_mib} MiB" if run.limit_mib else "none"
    outcome = f"{run.chunks:,} chunks" if run.ok else ("OOM-killed" if run.oom_killed else f"exit {run.exit_code}")
    if run.ok and run.worker_died:
        outcome += " (a worker was killed)"
    return f"limit {limit:>9}: {outcome:>36}, {run.wall_s:5.1f} s, charged peak {run.charged_peak_mib:.0f} MiB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", default=None, help="tree to index (default: the Django 5.1.4 source)")
    ap.add_argument("--low", type=int, default=160, help="a limit expected to fail (MiB)")
    ap.add_argument("--high", type=int, default=500, help="a limit expected to pass (MiB)")
    ap.add_argument("--step", type=int, default=10, help="resolution of the answer (MiB)")
    ap.add_argument("--no-worker-loss", action="store_true",
                    help="a run whose index worker was killed counts as failed: the limit at full speed")
    ap.add_argument("--workers", type=int, default=None, help="MOONMIND_INDEX_WORKERS for the runs (default: the product's)")
    args = ap.parse_args()
    from .owner import django_source

    source = Path(args.source) if args.source else django_source()
    try:
        free = index_in_group(source, None, args.workers)
    except OSError as e:
        raise SystemExit(f"cannot create a memory cgroup ({e}): run as root, or with a delegated cgroup") from None
    print(_line(free), flush=True)
    if not free.ok:
        raise SystemExit("the run without a limit failed")
    high = index_in_group(source, args.high, args.workers)
    print(_line(high), flush=True)
    if not high.ok or high.chunks != free.chunks:
        raise SystemExit(f"--high {args.high} MiB is not enough: raise it")
    low, best = args.low, high
    while best.limit_mib is not None and best.limit_mib - low > args.step:
        run = index_in_group(source, (low + best.limit_mib) // 2, args.workers)
        print(_line(run), flush=True)
        if run.ok and run.chunks == free.chunks and not (args.no_worker_loss and run.worker_died):
            best = run
        elif run.oom_killed:
            low = run.limit_mib or low
        else:
            raise SystemExit(f"the run failed at {run.limit_mib} MiB without an OOM kill (exit {run.exit_code})")
    what = "without losing a worker" if args.no_worker_loss else "(a worker may be killed)"
    print(f"smallest limit the run completes in {what}: {best.limit_mib} MiB (fails at {low} MiB); "
          f"{best.wall_s:.1f} s there against {free.wall_s:.1f} s without a limit, "
          f"which charged its group {free.charged_peak_mib:.0f} MiB at its peak")


if __name__ == "__main__":
    main()
