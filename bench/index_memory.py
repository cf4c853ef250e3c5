"""What each process of a cold `rag index` holds at the moment the run's summed RSS peaks.

`python -m bench.index_memory [--source DIR]` runs a real `moonmind rag index` of DIR (default: the
Django 5.1.4 source, `bench.owner.django_source`) into a scratch MOONMIND_HOME with MOONMIND_OWNER=off,
samples the process tree every 50 ms exactly as `bench.measure.run_tree_measured` does (RSS summed
over every process: the suite's figure), and at each new peak reads every process's
/proc/PID/smaps_rollup (RSS, PSS, anonymous and file-backed) and the writing process's mappings by
size. It prints the peak, that breakdown, the peak of the summed anonymous memory (sampled alike),
and the summed RSS once a second (where the peak falls: the index phase with its workers, or the
`optimize` at the end).

PSS divides each shared page among the processes mapping it (the interpreter, the libraries the
spawned workers share with each other), so the PSS column is what the run costs the machine;
the RSS sum, which counts those pages once per process, stays the goal's figure.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .measure import _rss_kb, _tree


def rollup(pid: int) -> dict[str, int]:
    """smaps_rollup of a process, kB per field (empty once it has exited)."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                m = re.match(r"(\w+):\s+(\d+) kB", line)
                if m:
                    out[m.group(1)] = int(m.group(2))
    except OSError:
        pass
    return out


def mappings(pid: int, home: str, top: int = 16) -> list[tuple[int, str]]:
    """The process's resident kB per mapped file (segment directories folded), largest first."""
    sizes: dict[str, int] = {}
    name = ""
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                    parts = line.split()
                    name = parts[5] if len(parts) > 5 else "[anon]"
                    name = re.sub(r"segments/[0-9a-f-]{36}/", "segments/*/", name.replace(home, "$HOME"))
                    name = re.sub(r"segment_builder_\w+/", "segment_builder/", name)
                elif line.startswith("Rss:"):
                    sizes[name] = sizes.get(name, 0) + int(line.split()[1])
    except OSError:
        pass
    return sorted(((kb, n) for n, kb in sizes.items()), reverse=True)[:top]


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline") as f:
            cmd = f.read().split("\0")
    except OSError:
        return "?"
    if "multiprocessing.spawn" in " ".join(cmd):
        return "index worker"
    if "multiprocessing.resource_tracker" in " ".join(cmd):
        return "resource tracker"
    return "writer (rag index)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", default=None, help="tree to index (default: the Django 5.1.4 source)")
    args = ap.parse_args()
    from .owner import MOONMIND, django_source

    source = Path(args.source) if args.source else django_source()
    home = tempfile.mkdtemp(prefix="moonmind-index-memory-")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MOONMIND_", "QDRANT_"))}
    env.update(MOONMIND_HOME=home, MOONMIND_OWNER="off")
    try:
        with tempfile.TemporaryFile("w+") as out:
            started = time.perf_counter()
            p = subprocess.Popen([MOONMIND, "rag", "index", str(source), "--repo", "bench", "--json"], env=env,
                                 stdout=out, stderr=subprocess.DEVNULL)
            peak, at, procs, maps, seconds = 0, 0.0, {}, [], []
            anon_peak = 0  # summed anonymous memory (what the kernel cannot take back without swap)
            while p.poll() is None:
                tree = _tree(p.pid)
                total = sum(_rss_kb(q) for q in tree)
                anon_peak = max(anon_peak, sum(rollup(q).get("Anonymous", 0) for q in tree))
                t = time.perf_counter() - started
                if len(seconds) <= int(t):
                    seconds.append(total)
                if total > peak:
                    seen = {q: (_cmdline(q), rollup(q)) for q in tree}
                    seen_maps = mappings(p.pid, home)
                    # A process caught as it exits reads as empty: keep the last whole snapshot instead.
                    if seen_maps and all(r for _, r in seen.values()):
                        peak, at, procs, maps = total, t, seen, seen_maps
                time.sleep(0.05)
            wall = time.perf_counter() - started
        if p.returncode != 0:
            raise SystemExit(f"rag index failed ({p.returncode})")
    finally:
        shutil.rmtree(home, ignore_errors=True)
    print(f"run {wall:.1f} s; summed RSS peak {peak / 1024:.0f} MiB at {at:.1f} s "
          f"(summed PSS then {sum(r.get('Pss', 0) for _, r in procs.values()) / 1024:.0f} MiB); "
          f"summed anonymous peak {anon_peak / 1024:.0f} MiB")
    print("| process | RSS | PSS | anonymous | file-backed |\n|---|---|---|---|---|")
    for name, r in sorted(procs.values(), key=lambda v: -v[1].get("Rss", 0)):
        rss, anon = r.get("Rss", 0), r.get("Anonymous", 0)
        print(f"| {name} | {rss / 1024:.0f} | {r.get('Pss', 0) / 1024:.0f} | {anon / 1024:.0f} | {(rss - anon) / 1024:.0f} |")
    print("writer's largest mappings at the peak (MiB):")
    for kb, name in maps:
        print(f"  {kb / 1024:7.1f}  {name}")
    print("summed RSS per second (MiB):", " ".join(f"{kb // 1024}" for kb in seconds))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
