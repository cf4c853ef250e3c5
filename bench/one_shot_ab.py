"""Interleaved A/B of one-shot `moonmind rag search` walls: several (executable, index) arms, one query at a time each.

`python -m bench.one_shot_ab --arm NAME=MOONMIND:HOME ...` runs the bench's 10 queries, each on every arm in
turn (so a busy moment hits all arms alike), `--rounds` passes after one warm-up pass, no owner
(MOONMIND_OWNER=off), and prints per arm the wall p10/p50/p90 and the CPU p50 (user + system of the
process, steadier than the wall on a shared machine). To run another checkout's code with this
venv, point an arm at a two-line wrapper: `PYTHONPATH=/that/checkout exec .venv/bin/moonmind "$@"`.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import time
from pathlib import Path

from .owner import QUERIES, env_for


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.one_shot_ab", description=__doc__.splitlines()[0])
    ap.add_argument("--arm", action="append", required=True, metavar="NAME=MOONMIND:HOME")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    arms = []
    for spec in args.arm:
        name, _, rest = spec.partition("=")
        exe, _, home = rest.rpartition(":")
        env = env_for(Path(home))
        env["MOONMIND_OWNER"] = "off"
        arms.append((name, exe, env))
    walls: dict[str, list[float]] = {name: [] for name, _, _ in arms}
    cpus: dict[str, list[float]] = {name: [] for name, _, _ in arms}
    for r in range(args.rounds + 1):
        for q in QUERIES:
            for name, exe, env in arms:
                c, t = _children_cpu(), time.perf_counter()
                p = subprocess.run([exe, "rag", "search", "--query", q], env=env, capture_output=True, timeout=300)
                wall, cpu = (time.perf_counter() - t) * 1000, (_children_cpu() - c) * 1000
                if p.returncode != 0:
                    raise RuntimeError(f"{name}: {p.stderr[-500:]!r}")
                if r:
                    walls[name].append(wall)
                    cpus[name].append(cpu)
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    for name, v in walls.items():
        v.sort()
        print(f"{name}: wall p10 {v[len(v) // 10]:.0f} / p50 {statistics.median(v):.0f} / p90 {v[len(v) * 9 // 10]:.0f} ms, "
              f"CPU p50 {statistics.median(cpus[name]):.0f} ms (n={len(v)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
