"""`moonmind worker doctor`: can this worker retrieve context right now?

Why real probes, not config parsing: a key that is set but revoked, a collection
built with another model, or a Qdrant that answers 403 all look fine on paper.
The doctor embeds a test string with the configured model, asks Qdrant about the
collection, and runs a tiny real query through the retrieval pipeline. Used by
the CLI and by the job bootstrap hook (`run_checks(settings)`).
"""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field

from .. import observe
from ..errors import CODES, EXIT_CONFIG, MoonmindError, redact
from ..settings import Settings

PROBE_TEXT = "moonmind doctor probe: where is authentication checked"
HTTP_TIMEOUT_S = 3.0


@dataclass
class Check:
    """One line of the checklist. `required` checks decide whether retrieval is usable."""

    name: str
    ok: bool
    detail: str
    remedy: str = ""
    required: bool = True
    code: str | None = None  # the error code of a failed check (errors.CODES)


@dataclass
class DoctorReport:
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when retrieval is usable: every required check passed."""
        return all(c.ok for c in self.checks if c.required)

    @property
    def exit_code(self) -> int:
        """0 when usable; otherwise the documented exit class of the first required failure."""
        if self.ok:
            return 0
        first = next(c for c in self.checks if c.required and not c.ok)
        return CODES[first.code][0] if first.code in CODES else EXIT_CONFIG

    def to_dict(self) -> dict:
        out: dict = {"ok": self.ok, "checks": [asdict(c) for c in self.checks]}
        failed = [c for c in self.checks if c.required and not c.ok]
        if failed:
            c = failed[0]
            out["error"] = {"code": c.code or "internal_error", "message": c.detail, "action": c.remedy}
        return out

    def render(self) -> str:
        width = max((len(c.name) for c in self.checks), default=0)
        lines = []
        for c in self.checks:
            mark = "✓" if c.ok else "✗"
            optional = "" if c.required or c.ok else " (optional)"
            lines.append(f"{mark} {c.name.ljust(width)}  {c.detail}{optional}")
            if not c.ok and c.remedy:
                lines.append(f"  {' ' * width}  remedy: {c.remedy}")
        lines.append("retrieval: usable" if self.ok else "retrieval: NOT usable")
        return "\n".join(lines) + "\n"


def _retrieval_token(settings: Settings) -> str | None:
    token = settings.retrieval_token
    return (token.get_secret_value() or None) if token is not None else None


def describe_store(settings: Settings) -> str:
    """Where the vectors live, never with credentials."""
    if settings.embedded_store:
        return f"embedded Qdrant Edge at {settings.data_dir}"
    url = settings.qdrant_url or ""
    if not url.lower().startswith(("http://", "https://")):
        return f"qdrant-client local mode ({url})"
    return redact(url, settings.secrets())


def _failed(name: str, err: MoonmindError, prefix: str = "") -> Check:
    return Check(name, False, f"{prefix}{err.message}", err.action, code=err.code)


def direct_checks(settings: Settings) -> list[Check]:
    """Embedding, store, collection metadata and a tiny real query (the direct transport), run by this process."""
    checks: list[Check] = []
    _direct_checks(settings, checks)
    return checks


def _owner_checks(settings: Settings) -> list[Check] | None:
    """The direct checks as the box's owner of the embedded store runs them, or None when no owner is alive.

    Why ask the owner: beside a running worker, gateway or `moonmind serve`, this process
    cannot open the store, but every search of this box is served by that owner, so its
    view is the one that tells whether retrieval works here.
    """
    from ..owner.client import OwnerGone, find

    owner = find(settings)
    if owner is None:
        return None
    pid, path = owner.pid, owner.path
    try:
        rows = owner.call("checks", {}, settings=settings.wire(), timeout_s=60.0)
    except OwnerGone:
        return None
    except MoonmindError as err:
        return [_failed("owner", err, f"the store's owner (PID {pid}): ")]
    checks = [Check(**row) for row in rows]
    checks.insert(0, Check("owner", True, f"embedded store served by PID {pid} over {path}", required=False))
    return checks


def _direct_checks(settings: Settings, checks: list[Check]) -> None:
    from .. import runtime
    from ..contracts import READABLE_SCHEMA_VERSIONS
    from ..store import lexstats, open_store

    provider, model = settings.embedding_provider, settings.model_name
    try:
        embedder = runtime.get_embedder(settings)
        started = time.perf_counter()
        vec = embedder.embed_query(PROBE_TEXT)
        ms = (time.perf_counter() - started) * 1000
        dims = int(len(vec))
        checks.append(Check("embedding", True, f"{provider} {model}: test embedding ok ({dims} dims, {ms:.0f} ms)"))
    except MoonmindError as err:
        checks.append(_failed("embedding", err, f"{provider} {model}: "))
        embedder, dims = None, None

    where = describe_store(settings)
    existing = runtime.existing_store(settings)
    store = None
    try:
        store = existing or open_store(settings)
        info = store.info()
    except MoonmindError as err:
        checks.append(_failed("qdrant", err, "" if "Qdrant" in err.message else f"{where}: "))
        _close(store, existing)
        return
    checks.append(Check("qdrant", True, f"{where}: reachable and authorised"))
    try:
        if info is None:
            checks.append(
                Check(
                    "collection", False, f"{settings.collection} does not exist",
                    "Run `moonmind rag index PATH --repo NAME` to create and fill it.", code="collection_missing",
                )
            )
            return
        if info.points == 0:
            checks.append(
                Check(
                    "collection", False, f"{info.name} exists but holds no chunks",
                    "Run `moonmind rag index PATH --repo NAME` to fill it.", code="collection_missing",
                )
            )
        else:
            checks.append(Check("collection", True, f"{info.name}: {info.points} points"))
        remedy = f"Run moonmind rag sync-embedding --collection {info.name}"
        if dims is not None:
            if info.dimensions == dims:
                checks.append(Check("dimension", True, f"collection dim={info.dimensions} = {model} output"))
            else:
                checks.append(
                    Check(
                        "dimension", False,
                        f"Collection {info.name} expects dim={info.dimensions} but {model} outputs {dims}.",
                        remedy, code="embedding_dimension_mismatch",
                    )
                )
        if info.model in (None, model):
            recorded = info.model or "not recorded"
            checks.append(Check("model", True, f"recorded {recorded}, configured {model}"))
        else:
            checks.append(
                Check(
                    "model", False,
                    f"Collection {info.name} was embedded with {info.model} but the configured model is {model}.",
                    f"{remedy}, or configure {info.model} again.", code="embedding_model_mismatch",
                )
            )
        readable = sorted(READABLE_SCHEMA_VERSIONS)
        if info.schema_version in READABLE_SCHEMA_VERSIONS:
            checks.append(Check("schema", True, f"payload schema v{info.schema_version} (this version reads {readable})"))
        else:
            checks.append(
                Check(
                    "schema", False, f"payload schema v{info.schema_version}; this version reads {readable}",
                    "Re-index into a fresh collection or upgrade moonmind-worker.", code="schema_unsupported",
                )
            )
        if embedder is not None and all(c.ok for c in checks):
            checks.append(_query_check(settings, embedder, store))
        if not lexstats.scoped(info):  # searches still work, with the engine's collection-wide BM25 statistics
            checks.append(Check(
                "lexical", False,
                f"{info.name} was made before BM25 statistics were kept per repository: a repository's scores "
                "change when another one is indexed into it",
                f"Run `moonmind rag sync-embedding --collection {info.name}` to rebuild it (no re-index needed).",
                required=False,
            ))
    finally:
        _close(store, existing)


def _query_check(settings: Settings, embedder, store) -> Check:
    from ..contracts import RetrievalQuery
    from ..retrieval.pipeline import retrieve_context_pack

    query = RetrievalQuery(query=PROBE_TEXT, top_k=1, overlay_policy="skip", score_threshold=0.0)
    try:
        started = time.perf_counter()
        with observe.no_artifacts():  # a probe, not context an agent used
            pack = retrieve_context_pack(query, settings=settings, embedder=embedder, store=store)
        ms = (time.perf_counter() - started) * 1000
    except MoonmindError as err:
        return _failed("query", err)
    return Check("query", True, f"test query returned {len(pack.items)} item(s) in {ms:.0f} ms")


def _close(store, existing) -> None:
    """Release a store the doctor opened itself (the embedded store's lock above all)."""
    if store is not None and store is not existing:
        try:
            store.close()
        except Exception:  # noqa: BLE001 - closing is best effort
            pass


def _gateway_check(url: str, token: str | None, required: bool) -> Check:
    health = url.rstrip("/") + "/retrieval/health"
    shown = redact(health)
    req = urllib.request.Request(health, headers={"Accept": "application/json"})
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S) as resp:
            import json

            body = json.loads(resp.read() or b"{}")
        if body.get("status") == "ok":
            return Check("gateway", True, f"{shown}: status ok", required=required)
        return Check(
            "gateway", False, f"{shown}: unexpected health answer", "Check MOONMIND_RETRIEVAL_URL points at a "
            "RetrievalGateway.", required=required, code="retrieval_failed",
        )
    except urllib.error.HTTPError as exc:
        if exc.code == 401:
            return Check("gateway", False, f"{shown}: HTTP 401, the token was rejected",
                         "Set MOONMIND_RETRIEVAL_TOKEN to a valid worker token.", required=required,
                         code="unauthenticated")
        if exc.code == 403:
            return Check("gateway", False, f"{shown}: HTTP 403, access denied",
                         "Ask for retrieval access for this worker token.", required=required, code="forbidden")
        return Check("gateway", False, f"{shown}: HTTP {exc.code}", "Check the gateway's logs and status.",
                     required=required, code="retrieval_failed")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = type(getattr(exc, "reason", exc)).__name__
        return Check("gateway", False, f"{shown}: cannot connect ({reason})",
                     "Check MOONMIND_RETRIEVAL_URL and that the gateway is up.", required=required,
                     code="retrieval_failed")


def _broker_check(url: str) -> Check:
    """The broker answers, within HTTP_TIMEOUT_S per wait: a broker that accepts TCP and then says
    nothing (half-open, wedged, a wrong service on the port) must not hang a worker's job start.

    Redis is asked PING with redis-py (a timeout on every read); other brokers go through kombu with
    read and write timeouts as well as the connect timeout.
    """
    shown = redact(url)
    try:
        if url.startswith(("redis://", "rediss://")):
            from ..transports.queue_client import redis_client

            client = redis_client(url, HTTP_TIMEOUT_S)
            try:
                client.ping()
            finally:
                client.close()
        else:
            from kombu import Connection

            options = {"max_retries": 0, "read_timeout": HTTP_TIMEOUT_S, "write_timeout": HTTP_TIMEOUT_S}
            with Connection(url, connect_timeout=HTTP_TIMEOUT_S, transport_options=options) as conn:
                conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=HTTP_TIMEOUT_S)
        return Check("broker", True, f"{shown}: reachable", required=False)
    except Exception as exc:  # noqa: BLE001 - any failure is "not reachable", reported without its text
        return Check("broker", False, f"{shown}: cannot connect ({type(exc).__name__})",
                     "Check CELERY_BROKER_URL and that the broker is up; events and queued searches need it.",
                     required=False, code="broker_unreachable")


def _statsd_check(host: str, port: int) -> Check:
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, kind, proto) as s:
            s.sendto(b"moonmind.doctor.ping:1|c", addr)
        return Check("statsd", True, f"{host}:{port} (UDP) resolves; test counter sent", required=False)
    except OSError as exc:
        return Check("statsd", False, f"{host}:{port}: {type(exc).__name__}",
                     "Check STATSD_HOST / STATSD_PORT; metrics are dropped until it resolves.", required=False)


def unused_provider_check(settings: Settings) -> Check | None:
    """Google credentials exported while the provider was left at its offline default: say they are unused.

    Why: a job's pre-flight may export GOOGLE_API_KEY / GOOGLE_EMBEDDING_MODEL; without
    MOONMIND_EMBEDDING_PROVIDER=google the static model keeps answering and nothing said so.
    """
    if settings.embedding_provider != "static" or "embedding_provider" in settings.model_fields_set:
        return None
    exported = [name for name, value in (("GOOGLE_API_KEY", settings.google_api_key),
                                         ("GOOGLE_EMBEDDING_MODEL", settings.google_embedding_model)) if value]
    if not exported:
        return None
    return Check(
        "provider", True,
        f"static (the offline default): {' and '.join(exported)} {'is' if len(exported) == 1 else 'are'} set but unused; "
        "export MOONMIND_EMBEDDING_PROVIDER=google to embed with Google (an existing collection then needs "
        "`moonmind rag sync-embedding --collection NAME`)",
        required=False,
    )


def run_checks(settings: Settings) -> DoctorReport:
    """Every prerequisite of retrieval, probed for real; never raises for a broken prerequisite."""
    checks: list[Check] = []
    gateway_url = settings.retrieval_url
    direct = _owner_checks(settings)
    if direct is None:
        direct = direct_checks(settings)
    if gateway_url:
        # Searches go through the gateway; the direct path matters only as the fallback.
        fallback = settings.retrieval_fallback == "direct"
        gw = _gateway_check(gateway_url, _retrieval_token(settings), True)
        direct_ok = all(c.ok for c in direct)
        if not gw.ok and fallback and direct_ok:
            gw.required = False  # the direct fallback carries retrieval
        for c in direct:
            c.required = not gw.ok and fallback
        checks.append(gw)
    checks.extend(direct)
    unused = unused_provider_check(settings)
    if unused is not None:
        checks.append(unused)
    broker = settings.configured_broker
    if broker:
        checks.append(_broker_check(broker))
    if settings.statsd_host:
        checks.append(_statsd_check(settings.statsd_host, settings.statsd_port))
    secrets = settings.secrets()
    for c in checks:
        c.detail, c.remedy = redact(c.detail, secrets), redact(c.remedy, secrets)
    return DoctorReport(checks)
