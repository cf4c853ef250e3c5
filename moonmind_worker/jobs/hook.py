"""The job lifecycle hook: make RAG obvious (or its absence explained) at job start; clean up at job end.

A job manifest is a JSON object with ``job_id``, ``run_id``, ``repo``, ``tenant`` and
``capabilities`` (either at the top level or under a ``"job"`` key). ``"requires": ["rag"]``
marks a job that must not run without retrieval.

`start_job` resolves ``job.capabilities.rag`` from real probes (`doctor.run_checks`):
``gateway`` when ``MOONMIND_RETRIEVAL_URL`` is set and healthy, ``direct-qdrant`` when the
direct prerequisites pass, otherwise the key is removed and ``job.rag.reason`` says why.
It records the doctor report, the banner, the prompt snippet and the job environment in
``job.rag``, exports MOONMIND_JOB_ID / RUN_ID / REPO / TENANT, and emits
``rag_capability_resolved`` (and ``doctor_failed``); RAG counts as available only when the
job's repository holds indexed chunks. `finish_job` removes the run's overlay (at once, through
the box's owner; queued for a gateway-only worker) and emits ``job_rag_finished``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, MutableMapping

from moonmind_worker.errors import MoonmindError
from moonmind_worker.ids import utc_timestamp
from moonmind_worker.observe import events
from moonmind_worker.settings import Settings

log = logging.getLogger("moonmind.jobs")

BANNER = "RAG available: run `moonmind rag search` to pull context from the knowledge base."
PROMPT_SNIPPET = "Before coding, call `moonmind rag search` to load repo knowledge from Qdrant."

DIRECT = "direct-qdrant"
GATEWAY = "gateway"
DIRECT_CHECKS = frozenset({"owner", "embedding", "qdrant", "collection", "dimension", "model", "schema", "query"})

#: manifest field -> environment variable exported to the job
ENV_FIELDS = {"job_id": "MOONMIND_JOB_ID", "run_id": "MOONMIND_RUN_ID", "repo": "MOONMIND_REPO", "tenant": "MOONMIND_TENANT"}


def job_of(manifest: dict[str, Any]) -> dict[str, Any]:
    """The job object: ``manifest["job"]`` when present, else the manifest itself."""
    job = manifest.get("job") if isinstance(manifest.get("job"), dict) else manifest
    if not isinstance(job, dict):
        raise MoonmindError("invalid_argument", "The job manifest is not a JSON object.",
                            "Pass a manifest like {\"job_id\": …, \"run_id\": …}.")
    return job


def requires_rag(job: dict[str, Any]) -> bool:
    req = job.get("requires") or []
    return "rag" in req if isinstance(req, list) else False


def resolve_capability(report, gateway_only: bool = False) -> tuple[str | None, str | None, str | None]:
    """(capability, reason when absent, remedy when absent) from a DoctorReport.

    `gateway_only` (a gateway configured with MOONMIND_RETRIEVAL_FALLBACK=none): the worker is not
    trusted with the store, so a gateway that is down leaves the job without RAG rather than
    falling back to direct access, which no token scopes.
    """
    gateway = next((c for c in report.checks if c.name == "gateway"), None)
    direct = [c for c in report.checks if c.name in DIRECT_CHECKS]
    if gateway is not None and gateway.ok:
        return GATEWAY, None, None
    if gateway_only and gateway is not None:
        return None, f"gateway: {gateway.detail}", (
            (gateway.remedy or "Fix the RetrievalGateway.")
            + " Direct access is off for this worker (MOONMIND_RETRIEVAL_FALLBACK=none)."
        )
    if direct and all(c.ok for c in direct) and any(c.name == "qdrant" for c in direct):
        return DIRECT, None, None
    failed = [c for c in ([gateway] if gateway is not None else []) + direct if not c.ok]
    if not failed:
        return None, "retrieval prerequisites were not checked", "Run `moonmind worker doctor`."
    first = failed[0]
    return None, f"{first.name}: {first.detail}", first.remedy or "Run `moonmind worker doctor` for details."


def _indexed_or_why(settings: Settings, repo: str, tenant: str | None) -> tuple[str | None, str | None, str | None]:
    """(capability, reason, remedy): RAG is available for a job only when its repository holds chunks."""
    from moonmind_worker import operations

    try:
        held = operations.chunk_count(settings, repo=repo, tenant=tenant)
    except MoonmindError as err:
        return None, f"collection: {err.message}", err.action
    if held:
        return DIRECT, None, None
    where = f"repo={repo}" + (f" tenant={tenant}" if tenant else "")
    return None, f"repository: nothing is indexed for {where}", (
        f"Index it first: `moonmind rag index PATH --repo {repo}" + (f" --tenant {tenant}" if tenant else "") + "`."
    )


def start_job(
    manifest: dict[str, Any],
    *,
    settings: Settings,
    environ: MutableMapping[str, str] | None = None,
    run_checks=None,
    workspace: Path | None = None,
) -> dict[str, Any]:
    """Resolve and record the RAG capability in `manifest` (in place, also returned); raise `job_blocked` when required and absent.

    The manifest is complete (capability, reason, doctor report) even when the job is blocked,
    so the control plane can show why. The job's tree (the manifest's ``workspace``, else `workspace`)
    is held for its run: what changes there reaches the run's overlay, never the canonical index
    (`owner.freshness.hold_tree`).
    """
    if run_checks is None:
        from moonmind_worker.jobs.doctor import run_checks
    environ = os.environ if environ is None else environ
    job = job_of(manifest)
    scope = {k: str(job[k]) for k in ENV_FIELDS if job.get(k) not in (None, "")}
    for key, var in ENV_FIELDS.items():
        if key in scope:
            environ[var] = scope[key]
    # events read the scope from the environment; make sure they see this job's even when `environ` is not os.environ
    fields = dict(scope)

    report = run_checks(settings)
    gateway_only = bool(settings.retrieval_url) and settings.retrieval_fallback == "none"
    capability, reason, remedy = resolve_capability(report, gateway_only)
    if capability == DIRECT and scope.get("repo"):
        capability, reason, remedy = _indexed_or_why(settings, scope["repo"], scope.get("tenant"))
    required = requires_rag(job)
    blocked = required and (capability is None or not report.ok)
    if blocked and reason is None:
        failed = next(c for c in report.checks if c.required and not c.ok)
        reason, remedy = f"{failed.name}: {failed.detail}", failed.remedy

    caps = job.setdefault("capabilities", {})
    if not isinstance(caps, dict):
        caps = job["capabilities"] = {}
    if capability:
        caps["rag"] = capability
    else:
        caps.pop("rag", None)
    job["rag"] = {
        "available": capability is not None,
        "capability": capability,
        "reason": reason,
        "remedy": remedy,
        "required": required,
        "blocked": blocked,
        "banner": BANNER if capability else None,
        "prompt_snippet": PROMPT_SNIPPET if capability else None,
        "environment": {ENV_FIELDS[k]: v for k, v in scope.items()},
        "doctor": report.to_dict(),
        "started_at": utc_timestamp(),
        "workspace": _hold_workspace(job, workspace, scope, settings),
    }

    events.publish("rag_capability_resolved", **fields, capability=capability, reason=reason, required=required, blocked=blocked)
    if not report.ok:
        failed = [c for c in report.checks if c.required and not c.ok]
        events.publish(
            "doctor_failed", **fields, blocked=blocked,
            checks=[{"name": c.name, "detail": c.detail, "remedy": c.remedy, "code": c.code} for c in failed],
        )
    if blocked:
        raise MoonmindError(
            "job_blocked",
            f"Job {scope.get('job_id', '?')} requires RAG but retrieval is not available ({reason}).",
            remedy or "Run `moonmind worker doctor` and fix what it reports.",
        )
    return manifest


def _hold_workspace(job: dict[str, Any], workspace: Path | None, scope: dict[str, str], settings: Settings) -> str | None:
    """Hold the job's tree for its run (see start_job); the tree held, or None (no tree, no run id, or not recorded)."""
    from moonmind_worker.owner.freshness import hold_tree

    given = job.get("workspace")
    root = Path(given) if isinstance(given, str) and given else workspace
    if root is None or not scope.get("run_id") or not root.is_dir():
        return None
    try:
        hold_tree(settings, root, run_id=scope["run_id"], repo=scope.get("repo") or settings.repo or "",
                  tenant=scope.get("tenant") or settings.scope_tenant, job_id=scope.get("job_id", ""))
    except (OSError, MoonmindError) as exc:
        log.warning("the job's tree %s is not held for run %s (%s): a watching owner may index its edits", root,
                    scope["run_id"], exc)
        return None
    return str(root.resolve())


def finish_job(
    manifest: dict[str, Any],
    *,
    settings: Settings,
    outcome: str = "success",
    enqueue=None,
) -> dict[str, Any]:
    """Remove the job's run overlay, record it in `job.rag`, emit `job_rag_finished`.

    The run's overlay is removed at once through the box's owner (or in this process); it is queued
    only for a worker that must not touch the store (gateway-only), or when `enqueue` is given, or
    when the direct clean fails. Every event of it carries the manifest's job, run, repo and tenant,
    whoever runs it (a shell's `job finish --manifest` has none of them in its environment).
    """
    job = job_of(manifest)
    scope = {k: str(job[k]) for k in ENV_FIELDS if job.get(k) not in (None, "")}
    job_settings = settings.model_copy(update=scope)
    rag = job.setdefault("rag", {})
    clean: dict[str, Any]
    run_id = scope.get("run_id")
    token = events.scope_override.set({k: scope.get(k) for k in ENV_FIELDS})
    try:
        if not run_id:
            clean = {"skipped": "the manifest has no run_id"}
        else:
            clean = _clean_run(run_id, job_settings, enqueue)
            _release_workspace(run_id, settings)
        rag["overlay_clean"] = clean
        rag["finished_at"] = utc_timestamp()
        rag["outcome"] = outcome
        events.publish("job_rag_finished", **scope, outcome=outcome, overlay_clean=clean)
    finally:
        events.scope_override.reset(token)
    return manifest


def _release_workspace(run_id: str, settings: Settings) -> None:
    from moonmind_worker.owner.freshness import release_trees

    try:
        release_trees(settings, run_id)
    except OSError as exc:
        log.warning("the trees of run %s stay recorded as held by a running job (%s)", run_id, exc)


def _clean_run(run_id: str, settings: Settings, enqueue=None) -> dict[str, Any]:
    gateway_only = bool(settings.retrieval_url) and settings.retrieval_fallback == "none"
    direct_error = None
    if enqueue is None and not gateway_only:
        try:
            return clean_overlay_now(run_id, settings)
        except MoonmindError as err:
            direct_error = err
    try:
        task_id = (enqueue or enqueue_overlay_clean)(run_id, settings)
        return {"task_id": task_id, "run_id": run_id}
    except MoonmindError as err:
        failed = direct_error or err
        return {"error": failed.code, "message": failed.message, "action": failed.action, "run_id": run_id}


def clean_overlay_now(run_id: str, settings: Settings) -> dict[str, Any]:
    """Remove the run's overlay now: through the box's owner (started if need be), or in this process."""
    from moonmind_worker import operations

    out = operations.overlay_clean(settings, run_id=run_id)
    return {"removed": int(out["removed"]), "run_id": run_id}


def enqueue_overlay_clean(run_id: str, settings: Settings) -> str:
    """Send `moonmind.rag.overlay_clean` for the run to the bulk queue; the task id (no wait)."""
    from moonmind_worker.transports.queue import enqueue
    from moonmind_worker.transports.queue_client import OVERLAY_CLEAN

    return enqueue(OVERLAY_CLEAN, {"request": {"run_id": run_id, "expired": False}}, queue=settings.index_queue,
                   timeout_s=5.0, wait=False, settings=settings)
