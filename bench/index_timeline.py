"""Where a cold `rag index` keeps the machine's cores busy, and where it does not: CPU per interval, writer and workers.

`python -m bench.index_timeline [--source DIR] [--every S]` runs a real `moonmind rag index` of DIR
(default: the Django 5.1.4 source, `bench.owner.django_source`) into a scratch MOONMIND_HOME with
MOONMIND_OWNER=off, and every S seconds (default 1) reads the user + system CPU of the writing process
and of its worker processes (/proc/PID/stat) and the tree's summed RSS. It prints one row per interval
(cores used by each side, workers alive, RSS) and a summary: the run's CPU and wall, and the intervals
with workers against those without (the segment builds, which run alone, and the start and the end).

Why: a profile says what the CPU is spent on; this says when the cores sit idle, which on a 2-core
box is the other half of a run's wall (issue 36: "the two builds run alone on ~1.2 cores").
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from .measure import _rss_kb, _tree
from .owner import MOONMIND, django_source, env_for

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of one process so far (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK


def is_worker(pid: int) -> bool:
    """An index worker (spawned by multiprocessing), not the resource tracker that starts with them."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"spawn_main" in f.read()
    except OSError:
        return False


def timeline(source: Path, every_s: float) -> tuple[list[dict], float]:
    """Rows of (t, writer cores, worker cores, workers alive, summed RSS MiB), and the run's wall."""
    home = Path(tempfile.mkdtemp(prefix="moonmind-index-timeline-"))
    rows: list[dict] = []
    seen: dict[int, float] = {}
    try:
        # stderr to a file, not a pipe: the run's progress lines would fill a pipe nobody reads until the end
        with (home / "stderr").open("w+") as err_file:
            start = time.perf_counter()
            p = subprocess.Popen([MOONMIND, "rag", "index", str(source), "--repo", "bench"], env=env_for(home / "home"),
                                 stdout=subprocess.DEVNULL, stderr=err_file, text=True)
            last = start
            while p.poll() is None:
                time.sleep(every_s)
                now = time.perf_counter()
                writer = workers = 0.0
                alive = 0
                tree = _tree(p.pid)
                for pid in tree:
                    used = cpu_s(pid)
                    if used is None:
                        continue
                    delta, seen[pid] = used - seen.get(pid, 0.0), used
                    if pid == p.pid:
                        writer += delta
                    else:  # a worker, or multiprocessing's resource tracker beside them (it uses next to no CPU)
                        workers += delta
                        alive += is_worker(pid)
                span, last = now - last, now
                rows.append({"t": now - start, "writer": writer / span, "workers": workers / span, "alive": alive,
                             "rss_mib": sum(_rss_kb(pid) for pid in tree) / 1024})
            wall = time.perf_counter() - start
            err_file.seek(0)
            err = err_file.read()
        if p.returncode != 0:
            raise SystemExit(f"rag index failed ({p.returncode}): {err[-2000:]}")
    finally:
        shutil.rmtree(home, ignore_errors=True)
    return rows, wall


def summary(rows: list[dict], wall: float) -> list[str]:
    """The run's cores used with workers alive and without (builds, start, end), and their seconds."""
    out = []
    working = [r for r in rows if r["alive"]]
    alone = [r for r in rows if not r["alive"]]
    for name, part in (("with workers", working), ("writer alone (builds, start, end)", alone)):
        if part:
            cores = statistics.fmean(r["writer"] + r["workers"] for r in part)
            out.append(f"{name}: {len(part)} intervals, {cores:.2f} cores on average")
    out.append(f"wall {wall:.1f} s; peak summed RSS {max((r['rss_mib'] for r in rows), default=0):.0f} MiB")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", help="tree to index (default: the Django 5.1.4 source)")
    ap.add_argument("--every", type=float, default=1.0, help="seconds between samples (default 1)")
    args = ap.parse_args()
    source = Path(args.source) if args.source else django_source()
    rows, wall = timeline(source, args.every)
    print(f"cold `rag index` of {source}; {os.cpu_count()} CPUs; every {args.every:g} s")
    print("| t (s) | writer cores | worker cores | workers | summed RSS |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['t']:.1f} | {r['writer']:.2f} | {r['workers']:.2f} | {r['alive']} | {r['rss_mib']:.0f} MiB |")
    print()
    for line in summary(rows, wall):
        print(line)


if __name__ == "__main__":
    main()
