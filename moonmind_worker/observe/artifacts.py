"""Context-pack artifacts and breadcrumbs: the "Context used" a run's dashboard shows.

Every finished search (unless inside `no_artifacts`) caches its pack JSON under the run's
artifacts directory and appends a breadcrumb line with the `context_pack_id` and sources.
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import re
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from .. import modes
from ..errors import MoonmindError
from ..owner.trust import ensure_private_dirs, open_private_file
from .sinks import publish, scope_fields

F = TypeVar("F", bound=Callable[..., Any])

log = logging.getLogger("moonmind_worker.breadcrumbs")

#: Run directory used when a search has no run id (ad-hoc use outside a job).
ADHOC_RUN = "adhoc"
PACKS_DIR = "context-packs"
BREADCRUMBS_FILE = "breadcrumbs.jsonl"

_UNSAFE_RUN = re.compile(r"[^A-Za-z0-9._-]+")
warn = logging.getLogger("moonmind_worker.artifacts")
_record_packs: contextvars.ContextVar[bool] = contextvars.ContextVar("moonmind_record_packs", default=True)


@contextmanager
def no_artifacts() -> Iterator[None]:
    """Searches inside this block are not cached as "Context used" (probes, evaluations); metrics and events still go out."""
    token = _record_packs.set(False)
    try:
        yield
    finally:
        _record_packs.reset(token)


def recording() -> bool:
    """False inside `no_artifacts`."""
    return _record_packs.get()


def run_dir_name(run_id: str | None) -> str:
    """A run id made safe as one directory name (no separators, no dot-files), one per run id.

    An id that had to be changed to be safe (`a*b`, `a?b`, an id with a zero-width space) gets
    a short hash of the original appended: otherwise two runs would share one directory and
    each would list the other's packs as its own "Context used".
    """
    raw = run_id or ""
    name = _UNSAFE_RUN.sub("_", raw).strip("._")[:128]
    if not name:
        return ADHOC_RUN if not raw else "run-" + _digest(raw)
    return name if name == raw else f"{name[:119]}-{_digest(raw)}"


def _digest(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]


def _settings(settings: Any):
    if settings is not None:
        return settings
    from ..settings import get_settings

    return get_settings()


def packs_dir(run_id: str | None, settings: Any = None) -> Path:
    return _settings(settings).artifacts_root / run_dir_name(run_id) / PACKS_DIR


def record_pack(pack: Any, settings: Any = None) -> Path | None:
    """Cache the pack JSON for the run, write one breadcrumb line, and announce it.

    The breadcrumb goes to `<artifacts>/<run>/breadcrumbs.jsonl` and to the
    `moonmind_worker.breadcrumbs` logger (a Celery worker's run log), never to stdout.
    """
    from ..contracts import json_dump

    settings = _settings(settings)
    run_id = pack.filters.get("run_id") or settings.run_id
    run_dir = settings.artifacts_root / run_dir_name(run_id)
    target = run_dir / PACKS_DIR / f"{pack.telemetry_id}.json"
    sources = [
        {"source": i.source, "lines": f"L{i.line_start}-L{i.line_end}", "score": i.score, "trust_class": i.trust_class}
        for i in pack.items
    ]
    written: Path | None = None
    # private unless MOONMIND_UMASK says otherwise: a pack holds the code it retrieved
    file_mode = modes.file_mode(settings)
    refused = _trusted_dirs(settings.artifacts_root, run_dir.name, PACKS_DIR)
    try:
        if refused is None:
            tmp = target.with_suffix(f".tmp.{os.getpid()}")
            # the pack's JSON without building pydantic's serializer (contracts.json_dump), compact as model_dump_json
            data = json.dumps(json_dump(pack), ensure_ascii=False, separators=(",", ":")).encode("utf-8")
            with os.fdopen(open_private_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, file_mode), "wb") as f:
                f.write(data)
            tmp.replace(target)  # a link planted at the target is replaced, never followed
            written = target
    except (OSError, MoonmindError) as exc:
        refused = refused or (exc.message if isinstance(exc, MoonmindError) else None)
    crumb = {
        "event": "context_pack_created",
        "context_pack_id": pack.telemetry_id,
        "retrieved_at": pack.retrieved_at,
        "run_id": run_id or "",
        "job_id": settings.job_id or "",
        "query": pack.query,
        "transport": pack.transport,
        "hits": len(pack.items),
        "latency_ms": pack.usage.latency_ms,
        "sources": sources,
        "artifact": str(written) if written else None,
    }
    line = json.dumps(crumb, separators=(",", ":"))
    try:
        if refused is None:
            fd = open_private_file(run_dir / BREADCRUMBS_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, file_mode)
            try:
                os.write(fd, (line + "\n").encode("utf-8"))
            finally:
                os.close(fd)
    except (OSError, MoonmindError) as exc:
        refused = exc.message if isinstance(exc, MoonmindError) else None
    if refused is not None:
        warn.warning("context pack not cached: %s", refused)
    log.info(line)
    publish(
        "context_pack_created",
        telemetry_id=pack.telemetry_id,
        sources=[s["source"] for s in sources],
        hits=len(sources),
        artifact=str(written) if written else None,
        **scope_fields(pack.filters),
    )
    return written


def _trusted_dirs(root: Path, *names: str) -> str | None:
    """Create (private) and check the artifacts directory and `names` under it; why it is refused, or None.

    Why: a pack holds the code it retrieved and a breadcrumb line is appended on every search, so a link or a
    directory another user can write, planted where they go, would have this process (root, often) write where
    that user chose. Each directory must be ours, not a link, and writable by no one else (owner/trust.py).
    """
    try:
        ensure_private_dirs(root, *names)
    except MoonmindError as exc:
        return exc.message
    except OSError as exc:
        return f"{root} cannot be created ({exc.strerror or type(exc).__name__})"
    return None


def prune_artifacts(settings: Any = None, now: float | None = None) -> int:
    """Delete the cached packs of runs with no search for MOONMIND_ARTIFACTS_RETENTION_DAYS (0 keeps all).

    Why: every search caches its pack, so a long-lived worker host would fill its disk. A run
    goes as a whole (never half of a "Context used" list) once its breadcrumb file, appended
    by every search of the run, is older than the window. Directories without a breadcrumb
    file or packs directory are not ours and are left alone. Returns the runs removed.
    """
    import shutil

    settings = _settings(settings)
    root: Path = settings.artifacts_root
    if not settings.artifacts_retention_days or not root.is_dir():
        return 0
    cutoff = (time.time() if now is None else now) - settings.artifacts_retention_days * 86400
    removed = 0
    for run_dir in root.iterdir():
        if run_dir.is_symlink() or not run_dir.is_dir():
            continue
        marks = [p for p in (run_dir / BREADCRUMBS_FILE, run_dir / PACKS_DIR) if p.exists()]
        if not marks:
            continue
        try:
            last = max(p.stat().st_mtime for p in marks)
        except OSError:
            continue  # removed meanwhile
        if last < cutoff:
            shutil.rmtree(run_dir, ignore_errors=True)
            removed += 1
    return removed


def list_packs(run_id: str | None, settings: Any = None) -> list[dict[str, Any]]:
    """Summaries of the packs cached for a run, oldest first (telemetry ids sort by time)."""
    out: list[dict[str, Any]] = []
    d = packs_dir(run_id, settings)
    if not d.is_dir():
        return out
    for path in sorted(d.glob("ctx_*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # a pack being written right now, or damaged: skip it
        items = data.get("items", [])
        out.append(
            {
                "telemetry_id": data.get("telemetry_id", path.stem),
                "retrieved_at": data.get("retrieved_at", ""),
                "query": data.get("query", ""),
                "transport": data.get("transport", ""),
                "hits": len(items),
                "sources": [f"{i.get('source')}#L{i.get('line_start')}-L{i.get('line_end')}" for i in items],
                "path": str(path),
            }
        )
    return out
