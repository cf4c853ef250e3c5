"""A job task that uses RAG the way an agent does: search, edit, overlay the edits, search again.

Run a worker with this module as its app (the embedded store wants one process: `--pool solo`,
or set QDRANT_URL for a Qdrant server):

    PYTHONPATH=docs/examples celery -A rag_job worker --pool solo

and send it a job (the manifest is docs/examples/job.json):

    from celery import Celery
    app = Celery(broker="redis://localhost:6379/0", backend="redis://localhost:6379/0")
    manifest = json.load(open("docs/examples/job.json"))
    app.send_task("examples.rag_job", kwargs={"manifest": manifest, "workspace": "/path/to/checkout",
                                             "question": "where are bearer tokens checked"},
                  queue="moonmind.index")  # a queue the worker reads (MOONMIND_INDEX_QUEUE), not Celery's "celery"

`base=JobTask` runs the job hook before the body: it resolves `capabilities.rag`, records
`manifest["rag"]` (available, reason, remedy, banner, the doctor report) and exports
MOONMIND_JOB_ID / RUN_ID / REPO / TENANT, so every `moonmind` command below is scoped to the
job's repository, tenant and run. A job whose manifest says `"requires": ["rag"]` fails with
`job_blocked` before this body runs when retrieval is not usable. When the task ends, the hook
removes the run's overlay (`moonmind job finish` does the same from a shell).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from moonmind_worker.celery import app
from moonmind_worker.celery.job_signals import JobTask

#: the CLI of the worker's own environment
MOONMIND = [shutil.which("moonmind") or str(Path(sys.executable).parent / "moonmind")]
#: the overlay recipe beside this file: every uncommitted change, untracked and deleted files included
OVERLAY_RECIPE = Path(__file__).resolve().parent / "overlay.sh"


def moonmind(*args: str, cwd: str) -> dict:
    """One `moonmind` command, as a job's agent would run it; the exit code and both streams."""
    p = subprocess.run([*MOONMIND, *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    return {"code": p.returncode, "stdout": p.stdout, "stderr": p.stderr}


@app.task(name="examples.rag_job", base=JobTask, bind=True)
def rag_job(self, manifest: dict, workspace: str, question: str) -> dict:
    rag = manifest["rag"]  # written by the job hook before this body runs
    if not rag["available"]:  # only reached when the manifest does not require RAG
        return {"rag": None, "reason": rag["reason"], "remedy": rag["remedy"]}

    # 1. context for the prompt (`--json`: the ContextPack; without it, markdown with citations)
    before = moonmind("rag", "search", question, "--json", cwd=workspace)

    # 2. ... the agent edits, adds and deletes files in `workspace` here ...

    # 3. its own edits become searchable for this run (MOONMIND_RUN_ID is the job's run)
    env = {**os.environ, "MOONMIND": MOONMIND[0]}
    p = subprocess.run(["bash", str(OVERLAY_RECIPE), "--json"], cwd=workspace, env=env,
                       capture_output=True, text=True, timeout=120)
    overlay = {"code": p.returncode, "stdout": p.stdout, "stderr": p.stderr}

    # 4. the same question now sees the edits first (trust_class "overlay"), deleted files gone
    after = moonmind("rag", "search", question, "--json", cwd=workspace)

    def pack(r: dict) -> dict | None:
        return json.loads(r["stdout"]) if r["code"] == 0 else None

    return {
        "rag": rag["capability"],
        "before": pack(before),
        "overlay": json.loads(overlay["stdout"]) if overlay["code"] == 0 and overlay["stdout"] else None,
        "after": pack(after),
        "errors": [r["stderr"] for r in (before, overlay, after) if r["code"] != 0],
    }
