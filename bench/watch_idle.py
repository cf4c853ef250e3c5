"""The watcher at rest: what a `moonmind serve` owner costs in CPU while nothing changes, watching or not.

`python -m bench.watch_idle [--seconds 60] [--tree DIR] [--edits 5]` copies a tree (default: this checkout's
`moonmind_worker/`, `tests/`, `docs/` and `bench/*.py`) into a scratch directory, indexes it into a
scratch MOONMIND_HOME, then for MOONMIND_WATCH=on and off in turn starts `moonmind serve`, waits
until its first pass over the tree is done (the owner's `freshness` operation), and reads the owner
process's CPU time (utime + stime of /proc/PID/stat, every thread) and context switches before and
after `--seconds` of rest. Prints JSON: CPU seconds, percent of one core and wake-ups per second per
mode, the passes run during the rest (must be 0), the tree's files and directories, and the owner's
threads; then, watching, `--edits` times: a function appended to the tree's first Python file, and
the seconds until a search through the owner answers with it (`edit_to_search_s`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MOONMIND = str(Path(sys.executable).parent / "moonmind")
COLLECTION = "moonmind__repo"


def cpu_seconds(pid: int) -> float:
    """utime + stime of a whole process (all its threads), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def switches(pid: int) -> int:
    """Context switches of every thread of a process so far: how often it woke up."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except FileNotFoundError:  # a thread that ended since the listing (the owner's index run's helpers)
            continue
        for line in status.splitlines():
            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                total += int(line.split()[1])
    return total


def owner_state(home: Path) -> dict | None:
    from moonmind_worker.owner.client import connect

    owner = connect(home / "qdrant-edge", COLLECTION)
    return None if owner is None else owner.call("freshness", {})


def copy_tree(dest: Path, tree: Path | None) -> Path:
    if tree is not None:
        shutil.copytree(tree, dest, symlinks=True, ignore=shutil.ignore_patterns(".git"))
        return dest
    for name in ("moonmind_worker", "tests", "docs"):
        shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__", "models"))
    (dest / "bench").mkdir()
    for f in (ROOT / "bench").glob("*.py"):
        shutil.copy2(f, dest / "bench" / f.name)
    return dest


def edit_latency(home: Path, tree: Path, rounds: int) -> list[float]:
    """Seconds from saving an edit to the first search through the owner that answers with it, per round."""
    from moonmind_worker.owner.client import connect

    target = min(p for p in tree.rglob("*.py") if "/." not in p.as_posix())
    rel, original = target.relative_to(tree).as_posix(), target.read_text()
    out = []
    try:
        for i in range(rounds):
            token = f"freshness_probe_{i}_{os.getpid()}"
            query = {"query": token, "top_k": 3, "score_threshold": 0.0, "filters": {"repo": "watched", "path": rel}}
            target.write_text(f"{original}\n\ndef {token}():\n    return {i}\n")
            started = time.monotonic()
            while True:
                pack = connect(home / "qdrant-edge", COLLECTION).call("search", {"query": query, "record": False})
                if any(token in item["text"] for item in pack["items"]):
                    break
                if time.monotonic() - started > 120:
                    raise SystemExit(f"edit {i} was never searched")
                time.sleep(0.01)
            out.append(round(time.monotonic() - started, 3))
            while not settled(owner_state(home), "on"):  # the next edit starts from a caught-up owner
                time.sleep(0.05)
    finally:
        target.write_text(original)
    return out


def settled(state: dict | None, watch: str) -> bool:
    return state is not None and all(t["ready"] and not t["pending"] and not t["passing"] for t in state["trees"]) and (
        watch == "off" or bool(state["trees"]))


def rest(env: dict[str, str], home: Path, watch: str, seconds: float, log: Path, tree: Path, edits: int) -> dict:
    with open(log, "w") as out:
        proc = subprocess.Popen([MOONMIND, "serve"], env={**env, "MOONMIND_WATCH": watch}, stdout=subprocess.DEVNULL,
                                stderr=out, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while True:  # up, and (watching) caught up with the tree
            state = owner_state(home) if (home / "qdrant-edge" / COLLECTION / "owner.sock").exists() else None
            if settled(state, watch):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the owner did not settle (see {log})")
            time.sleep(0.1)
        before, woke, passes = cpu_seconds(proc.pid), switches(proc.pid), state["passes"]
        time.sleep(seconds)  # the measurement itself: the owner at rest
        used, woke = cpu_seconds(proc.pid) - before, switches(proc.pid) - woke
        after = owner_state(home) or {}
        threads = len(list(Path(f"/proc/{proc.pid}/task").iterdir()))
        row = {"watch": watch, "cpu_s": round(used, 3), "cpu_pct_of_one_core": round(100 * used / seconds, 3),
               "wakeups_per_s": round(woke / seconds, 1), "passes_during_rest": after.get("passes", 0) - passes,
               "threads": threads}
        if watch == "on" and edits:
            row["edit_to_search_s"] = edit_latency(home, tree, edits)
        return row
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.watch_idle", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60.0, help="rest measured per mode (default 60)")
    p.add_argument("--tree", type=Path, default=None, help="the tree to watch (default: a copy of this checkout's sources)")
    p.add_argument("--edits", type=int, default=5, help="after the rest, edits timed until a search answers with them")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="moonmind-watch-idle-") as work:
        tree = copy_tree(Path(work) / "tree", args.tree)
        home = Path(work) / "home"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MOONMIND_", "QDRANT_"))}
        env.update(MOONMIND_HOME=str(home), MOONMIND_OWNER="off")
        subprocess.run([MOONMIND, "rag", "index", str(tree), "--repo", "watched"], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        env["MOONMIND_OWNER"] = "use"
        files = sum(len(f) for _, _, f in os.walk(tree))
        dirs = sum(1 for _ in os.walk(tree))
        modes = [rest(env, home, watch, args.seconds, Path(work) / f"owner-{watch}.log", tree, args.edits)
                 for watch in ("on", "off")]
    print(json.dumps({"seconds": args.seconds, "tree_files": files, "tree_dirs": dirs, "modes": modes,
                      "loadavg_at_end": os.getloadavg()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
