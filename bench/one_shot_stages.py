"""Where a one-shot search's time goes: CPU and wall per stage, in one fresh process per run.

`python -m bench.one_shot_stages --home H [--runs 5] [QUERY]` runs, in a child process per run, the
stages `moonmind rag search` goes through (CLI module, pydantic + contracts, the pipeline's modules,
the embedder, opening the shard, validating the query, the first search) and prints the median CPU
and wall of each. Run it under another checkout's code with PYTHONPATH=/that/checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from .owner import env_for

_CHILD = r"""
import json, resource, sys, time
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF); return r.ru_utime + r.ru_stime
c0, t0, out = cpu(), time.perf_counter(), {}
def mark(n):
    global c0, t0
    c, t = cpu(), time.perf_counter(); out[n] = ((c - c0) * 1000, (t - t0) * 1000); c0, t0 = c, t
import moonmind_worker.cli.main
from moonmind_worker.settings import get_settings
s = get_settings(); mark("CLI module + settings")
from pydantic import BaseModel
from moonmind_worker import contracts; mark("pydantic + contracts")
from moonmind_worker.retrieval import pipeline
from moonmind_worker import runtime
from moonmind_worker.owner import ops; mark("pipeline, store and embedding modules")
emb = runtime.get_embedder(s); mark("embedder")
st = runtime.get_store(s); st.info(); mark("store open (shard + metadata)")
q = contracts.parse_query({"query": sys.argv[1]}); mark("query validated")
pack = pipeline.retrieve_context_pack(q, settings=s, embedder=emb, store=st)
# the dump `rag search` does (owner.ops.search); a checkout without contracts.json_dump dumps with pydantic
(getattr(contracts, "json_dump", None) or (lambda p: p.model_dump(mode="json")))(pack); mark("first search")
out["numpy loaded"] = "numpy" in sys.modules
print(json.dumps(out))
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.one_shot_stages", description=__doc__.splitlines()[0])
    ap.add_argument("--home", required=True)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("query", nargs="?", default="template variable resolution")
    args = ap.parse_args(argv)
    env = env_for(Path(args.home))
    env["MOONMIND_OWNER"] = "off"
    if os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    runs = []
    for _ in range(args.runs):
        # cwd: not a checkout, whose moonmind_worker would shadow the one PYTHONPATH or the venv names
        p = subprocess.run([sys.executable, "-c", _CHILD, args.query], env=env, capture_output=True, text=True, timeout=300,
                           cwd=tempfile.gettempdir())
        if p.returncode != 0:
            raise RuntimeError(p.stderr[-800:])
        runs.append(json.loads(p.stdout))
    print(f"| stage | CPU ms | wall ms |  (median of {args.runs}; numpy loaded: {runs[0]['numpy loaded']})")
    print("|---|---|---|")
    for stage in [k for k in runs[0] if k != "numpy loaded"]:
        print(f"| {stage} | {statistics.median(r[stage][0] for r in runs):.0f} | {statistics.median(r[stage][1] for r in runs):.0f} |")
    print(f"| total | {sum(statistics.median(r[k][0] for r in runs) for k in runs[0] if k != 'numpy loaded'):.0f} | |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
