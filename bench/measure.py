"""Small measuring helpers: robust summaries, per-process peak memory, timed subprocesses."""

from __future__ import annotations

import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass


@dataclass
class Figure:
    """One reported number: median and spread over `n` repeated measurements."""

    name: str
    unit: str
    values: list[float]
    goal: str = ""
    met: bool | None = None
    note: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")

    @property
    def spread(self) -> str:
        if len(self.values) < 2:
            return "—"
        return f"{fmt(min(self.values))}–{fmt(max(self.values))}"


def fmt(x: float) -> str:
    if x != x:  # NaN
        return "n/a"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile, q in [0, 100]."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


@dataclass
class ProcResult:
    wall_s: float
    maxrss_mib: float
    code: int
    stdout: str
    stderr: str


# A small launcher process starts the measured command and reaps it with wait4:
# ru_maxrss persists across execve, so a child forked straight from a big
# parent (this suite) would report the parent's size instead of its own.
_LAUNCHER = r"""
import json, os, subprocess, sys
out = sys.argv[1]
p = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(p.pid, 0)
open(out, "w").write(json.dumps({"code": os.waitstatus_to_exitcode(status), "maxrss_kb": usage.ru_maxrss}))
"""


def run_measured(cmd: list[str], env: dict[str, str], timeout: float = 300, cwd: str | None = None) -> ProcResult:
    """Run a command to completion: wall time (launcher overhead excluded) and its own peak RSS (MiB)."""
    import json
    import tempfile

    with tempfile.NamedTemporaryFile("r", suffix=".json") as rec:
        started = time.perf_counter()
        p = subprocess.run([sys.executable, "-c", _LAUNCHER, rec.name, *cmd], env=env, cwd=cwd, capture_output=True,
                           text=True, timeout=timeout)
        wall = time.perf_counter() - started
        data = json.loads(open(rec.name).read() or "{}")
    if p.returncode != 0 and "code" not in data:
        raise RuntimeError(f"launcher failed: {p.stderr[-500:]}")
    return ProcResult(wall - _launcher_overhead(), data["maxrss_kb"] / 1024, data["code"], p.stdout, p.stderr)


_OVERHEAD: list[float] = []


def _launcher_overhead() -> float:
    """Seconds the launcher itself adds (a bare interpreter start), measured once: subtracted from walls."""
    if not _OVERHEAD:
        runs = []
        for _ in range(3):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", "import json, os, subprocess, sys"], check=True)
            runs.append(time.perf_counter() - t0)
        _OVERHEAD.append(min(runs))
    return _OVERHEAD[0]


def vm_hwm_mib(pid: int) -> float:
    """Peak resident memory of a live process (VmHWM), MiB; NaN if unreadable."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def self_peak_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def stop_group(proc, wait_s: float = 30.0) -> None:
    """SIGTERM a process started with start_new_session=True (and its children), SIGKILL if it lingers."""
    import signal
    import subprocess

    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(wait_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _tree(pid: int) -> list[int]:
    """`pid` and every process below it (Linux /proc)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return out


def _rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


@dataclass
class TreeResult:
    wall_s: float
    tree_peak_mib: float  # the largest sum of RSS over the process and its children seen at one sample
    code: int
    stdout: str
    stderr: str
    #: user + system CPU of the process and of every descendant reaped under it (worker pools are): on a
    #: box whose speed drifts within the hour, less noisy than the wall, and what a saturated box's wall follows
    cpu_s: float = 0.0


def run_tree_measured(cmd: list[str], env: dict[str, str], timeout: float = 900, every_s: float = 0.05) -> TreeResult:
    """Run a command that may start worker processes: wall and the peak of the whole tree's RSS, summed.

    Why not ru_maxrss: for a process with children it is the largest single process, not their sum,
    so an indexer that spreads its work over processes would look smaller than it is. Summed RSS
    counts pages the processes share (the interpreter, libraries) once per process: an upper bound.
    """
    import tempfile

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.perf_counter()
        p = subprocess.Popen(cmd, env=env, stdout=out, stderr=err, text=True)
        peak = 0
        while True:
            # reaped here, not by poll(): wait4 gives the rusage of the process and what it reaped
            pid, status, usage = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            peak = max(peak, sum(_rss_kb(q) for q in _tree(p.pid)))
            if time.perf_counter() - started > timeout:
                p.kill()
                p.wait()
                raise RuntimeError(f"{cmd[:3]} took more than {timeout} s")
            time.sleep(every_s)
        wall = time.perf_counter() - started
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return TreeResult(wall, peak / 1024, p.returncode, out.read(), err.read(), usage.ru_utime + usage.ru_stime)
