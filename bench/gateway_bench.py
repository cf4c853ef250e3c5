"""RetrievalGateway throughput and latency: requests/s, p50, p99 at concurrency 1, 8 and 32.

Builds a synthetic repository large enough for >= 10k chunks (deterministic: seeded), indexes it with
the offline model into a scratch MOONMIND_HOME, starts `moonmind gateway serve` on a free loopback
port, and drives POST /retrieval/context with `wrk` (Debian package) using a rotating set of queries.
Bounded: the index is built once and cached under --work; each level runs --duration seconds.

    python bench/gateway_bench.py --work /tmp/mm-bench --duration 15 [--workers 1]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

WORDS = (
    "token bearer auth session cache redis pool connection query index vector embed chunk search filter tenant "
    "repo overlay budget latency retry backoff queue worker celery task event metric statsd gateway route handler "
    "request response header payload schema model config settings store qdrant shard segment collection point "
    "score rank fuse lexical sparse dense cosine threshold deadline timeout guard doctor probe health status"
).split()
QUERIES = [
    "where are bearer tokens checked", "connection pool acquire release", "retry with exponential backoff",
    "cache ttl in redis", "how is the latency budget enforced", "tenant filter on search", "overlay merge order",
    "embedding dimension mismatch", "queue worker task routing", "health check status endpoint",
]


def make_repo(root: Path, files: int, seed: int = 7) -> None:
    rng = random.Random(seed)
    for f in range(files):
        pkg = root / f"pkg{f % 40:02d}"
        pkg.mkdir(parents=True, exist_ok=True)
        parts = [f'"""Module {f}: {" ".join(rng.choices(WORDS, k=12))}."""\n\n']
        for i in range(14):
            name = "_".join(rng.choices(WORDS, k=3))
            body = "\n".join(
                f"    {rng.choice(WORDS)}_{j} = {rng.choice(WORDS)}({rng.choice(WORDS)}, {rng.randint(0, 99)})"
                for j in range(rng.randint(6, 14))
            )
            doc = " ".join(rng.choices(WORDS, k=10))
            parts.append(f'def {name}_{i}(request, settings):\n    """{doc}."""\n{body}\n    return {rng.choice(WORDS)}\n\n\n')
        (pkg / f"mod{f:05d}.py").write_text("".join(parts))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def moonmind() -> str:
    return shutil.which("moonmind") or str(Path(sys.executable).parent / "moonmind")


def parse_wrk(out: str) -> dict:
    """wrk's summary as numbers; a clear error (with wrk's output) when it is not what was expected."""

    def find(pattern: str) -> str:
        m = re.search(pattern, out, re.M)
        if m is None:
            raise RuntimeError(f"unexpected wrk output (no match for {pattern!r}):\n{out}")
        return m.group(1)

    def ms(v: str) -> float:
        m = re.match(r"([\d.]+)(us|ms|s|m)$", v)
        if m is None:
            raise RuntimeError(f"unexpected wrk latency {v!r}:\n{out}")
        n, unit = float(m.group(1)), m.group(2)
        return {"us": n / 1000, "ms": n, "s": n * 1000, "m": n * 60000}[unit]

    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {"rps": float(find(r"Requests/sec:\s+([\d.]+)")), "p50_ms": ms(find(r"^\s+50%\s+(\S+)")),
            "p99_ms": ms(find(r"^\s+99%\s+(\S+)")), "requests": int(find(r"(\d+) requests in")),
            "non_2xx": int(non2xx.group(1)) if non2xx else 0}


LUA = """
local queries = {%s}
local n = 0
request = function()
  n = n + 1
  local body = '{"query": "' .. queries[(n %% #queries) + 1] .. '", "filters": {"repo": "bench", "tenant": "acme"}}'
  return wrk.format("POST", "/retrieval/context", {["Content-Type"] = "application/json", ["Authorization"] = "Bearer %s"}, body)
end
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default="/tmp/mm-gateway-bench")
    ap.add_argument("--files", type=int, default=1800)
    ap.add_argument("--duration", type=int, default=15)
    ap.add_argument("--levels", default="1,8,32")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="gateway processes (default: one per core)")
    args = ap.parse_args()
    if not shutil.which("wrk"):
        sys.exit("wrk not found: apt-get install -y wrk")
    work = Path(args.work)
    home, repo = work / "home", work / "repo"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QDRANT_", "MOONMIND_", "OPENAI_", "GOOGLE_"))}
    env["MOONMIND_HOME"] = str(home)
    if not (home / "qdrant-edge").exists():
        make_repo(repo, args.files)
        t = time.monotonic()
        subprocess.run([moonmind(), "rag", "index", str(repo), "--repo", "bench", "--tenant", "acme"], env=env, check=True)
        print(f"indexed in {time.monotonic() - t:.1f} s", file=sys.stderr)
    stats = subprocess.run([moonmind(), "rag", "stats", "--repo", "bench", "--tenant", "acme", "--json"],
                           env=env, capture_output=True, text=True)
    load_before = os.getloadavg()
    tokens_file = home / "gateway-tokens.json"
    tokens_file.unlink(missing_ok=True)
    token = subprocess.run([moonmind(), "gateway", "add-token", "--name", "bench", "--repo", "bench", "--tenant", "acme"],
                           env=env, capture_output=True, text=True, check=True).stdout.strip()
    port = free_port()
    proc = subprocess.Popen([moonmind(), "gateway", "serve", "--port", str(port), "--workers", str(args.workers)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        import urllib.request

        for _ in range(300):
            try:
                urllib.request.urlopen(url + "/retrieval/health", timeout=2).read()
                break
            except OSError:
                time.sleep(0.2)
        script = work / "post.lua"
        script.write_text(LUA % (", ".join(json.dumps(q) for q in QUERIES), token))
        subprocess.run(["wrk", "-t1", "-c2", "-d3s", "-s", str(script), url], capture_output=True)  # warm-up, every worker
        results = {}
        for level in [int(x) for x in args.levels.split(",")]:
            threads = min(level, 2)
            out = subprocess.run(
                ["wrk", f"-t{threads}", f"-c{level}", f"-d{args.duration}s", "--timeout", "10s", "--latency",
                 "-s", str(script), url],
                capture_output=True, text=True, check=True,
            ).stdout
            results[level] = parse_wrk(out)
            print(f"c={level}: {results[level]}", file=sys.stderr)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    chunks = None
    try:
        chunks = sum(f["chunks"] for f in json.loads(stats.stdout)["files"]) if stats.returncode == 0 else None
    except ValueError:
        pass
    print(json.dumps({"chunks": chunks, "workers": args.workers, "loadavg_before": load_before, "levels": results,
                      "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                      "loadavg_after": os.getloadavg()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
