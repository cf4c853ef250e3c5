"""One settings object, read once from the environment and `.env`.

Why one object: every entry point (CLI, Celery task, gateway) must agree on the
collection, the embedding model and the store, or retrieval silently degrades.

Why no pydantic here: every `moonmind` process reads settings, and importing
pydantic (let alone pydantic-settings) costs
more than the whole `rag search --execution queue` round trip to a warm worker.
So `Settings` is a plain class over a field table (`Settings.model_fields`) with
small typed coercions, keeping the rules pydantic applied: each field is read from
its env alias(es), case-insensitively; the real environment beats `.env`; keyword
arguments (field name or alias) beat both; `_env_file=None` skips `.env`; unknown
keywords are ignored. An invalid value is a `MoonmindError("invalid_setting")`
naming the variable, the value (never a secret's) and the rule.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from contextvars import ContextVar
from functools import lru_cache
from pathlib import Path

from .errors import MoonmindError, redact

TYPE_CHECKING = False  # annotations only: the thin client's path imports no `typing` (see cli/main.py)
if TYPE_CHECKING:
    from typing import Any, Callable, ClassVar, Iterator, Literal

    EmbeddingProvider = Literal["static", "openai", "google", "ollama", "cohere"]


#: Default model per provider, used when MOONMIND_EMBEDDING_MODEL is unset.
DEFAULT_MODELS: dict[str, str] = {
    "static": "moonmind-static-code-256",
    "openai": "text-embedding-3-small",
    "google": "gemini-embedding-001",
    "ollama": "nomic-embed-text",
    # a multilingual hosted model, through Cohere's OpenAI-compatible endpoint (embedding/presets.py)
    "cohere": "embed-multilingual-v3.0",
}


class Secret:
    """A secret string whose repr and str never show it (read it with `get_secret_value()`)."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def get_secret_value(self) -> str:
        return self._value

    def __str__(self) -> str:
        return "**********" if self._value else ""

    def __repr__(self) -> str:
        return f"Secret('{self}')"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


# ------------------------------------------------------------- coercions ---


class Rule:
    """A coercion and its wording ("an integer between 1 and 50"), which error messages quote.

    `convert` takes a raw value (a string from the environment, or any keyword value) and
    returns the typed value, or raises ValueError when the value breaks the rule.
    """

    def __init__(self, text: str, convert: Callable[[Any], Any]) -> None:
        self.text = text
        self.convert = convert

    def __call__(self, raw: Any) -> Any:
        try:
            return self.convert(raw)
        except (TypeError, ValueError):
            raise ValueError(self.text) from None


def _bounds(ge: float | None, gt: float | None, le: float | None, lt: float | None) -> str:
    if ge is not None and le is not None:
        return f" between {ge:g} and {le:g}"
    parts = []
    if ge is not None:
        parts.append(f"no less than {ge:g}")
    if gt is not None:
        parts.append(f"greater than {gt:g}")
    if le is not None:
        parts.append(f"no more than {le:g}")
    if lt is not None:
        parts.append(f"less than {lt:g}")
    return " " + " and ".join(parts) if parts else ""


def _within(v: float, ge: float | None, gt: float | None, le: float | None, lt: float | None) -> bool:
    return not (
        v != v  # NaN
        or (ge is not None and v < ge)
        or (gt is not None and v <= gt)
        or (le is not None and v > le)
        or (lt is not None and v >= lt)
    )


def integer(*, ge: int | None = None, gt: int | None = None, le: int | None = None, lt: int | None = None) -> Rule:
    """An int from an int, an integral float, or a string such as "8", " 8 ", "8.0" (pydantic's lax rules)."""

    def convert(raw: Any) -> int:
        if isinstance(raw, str):
            try:
                raw = int(raw.strip())
            except ValueError:
                raw = float(raw)
        if isinstance(raw, float) and raw.is_integer():
            raw = int(raw)
        if isinstance(raw, bool) or not isinstance(raw, int) or not _within(raw, ge, gt, le, lt):
            raise ValueError
        return raw

    return Rule("an integer" + _bounds(ge, gt, le, lt), convert)


def number(*, ge: float | None = None, gt: float | None = None, le: float | None = None, lt: float | None = None) -> Rule:
    """A float from a number or a numeric string."""

    def convert(raw: Any) -> float:
        if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
            raise ValueError
        v = float(raw)
        if not _within(v, ge, gt, le, lt):
            raise ValueError
        return v

    return Rule("a number" + _bounds(ge, gt, le, lt), convert)


def text(*, min_length: int = 0) -> Rule:
    def convert(raw: Any) -> str:
        if not isinstance(raw, str) or len(raw) < min_length:
            raise ValueError
        return raw

    return Rule("a non-empty string" if min_length else "a string", convert)


def choice(*choices: str) -> Rule:
    def convert(raw: Any) -> str:
        if raw not in choices:
            raise ValueError
        return raw

    return Rule("one of " + ", ".join(choices), convert)


def _to_path(raw: Any) -> Path:
    if not isinstance(raw, (str, os.PathLike)):
        raise ValueError
    return Path(raw).expanduser()


def _to_absolute_path(raw: Any) -> Path:
    p = _to_path(raw)
    if not p.is_absolute():
        raise ValueError
    return p


def _to_secret(raw: Any) -> Secret:
    if isinstance(raw, Secret):
        return raw
    if not isinstance(raw, str):
        raise ValueError
    return Secret(raw)


def _to_umask(raw: Any) -> int:
    if isinstance(raw, bool) or not isinstance(raw, (int, str)):
        raise ValueError
    if isinstance(raw, str):
        digits = raw.strip().lower().removeprefix("0o")
        if not digits or len(digits) > 4 or any(c not in "01234567" for c in digits):
            raise ValueError
        raw = int(digits, 8)
    if not 0 <= raw <= 0o777 or raw & 0o022 != 0o022:
        raise ValueError
    return raw


def _to_qdrant_url(raw: Any) -> str:
    """A Qdrant server's http(s) URL, `:memory:`, or a local-mode path written so it cannot be taken for a host.

    Why so strict: qdrant-client takes anything that is not a URL for a path, so `localhost:6333`
    (no scheme) silently became a local store in a directory named `localhost:6333/`.
    """
    if not isinstance(raw, str):
        raise ValueError
    url = raw.strip()
    low = url.lower()
    if low.startswith(("http://", "https://")):
        host = url.split("://", 1)[1]
        if not host or host[0] in "/?#:":
            raise ValueError
        return url
    if url == ":memory:":
        return url
    if low.startswith("file://") and len(url) > len("file://"):
        return url
    if url in (".", "..", "~") or url.startswith(("/", "./", "../", "~/")):
        return url
    raise ValueError


#: a path, `~` expanded
path = Rule("a file-system path", _to_path)
#: where the vectors live when not in the embedded store (store/remote.py)
qdrant_url = Rule(
    "an http:// or https:// URL of a Qdrant server (e.g. http://localhost:6333: a bare host:port is not a URL), "
    "`:memory:`, or a path for qdrant-client's local mode written as one: absolute (/...), ~/..., ./... or ../..., "
    "or file://PATH",
    _to_qdrant_url,
)
#: an absolute path, `~` expanded (a relative one would depend on the directory a client started us in)
absolute_path = Rule("an absolute file-system path", _to_absolute_path)
secret = Rule("a string", _to_secret)
#: an octal umask; group and others never get write (owner/trust.py refuses such directories)
octal_umask = Rule("an octal umask that masks group and other write (022), e.g. 077 or 027", _to_umask)


class Field:
    """One setting: its env aliases, default and coercion. `optional` admits None; `blank_is_unset` maps "" to None."""

    def __init__(self, *aliases: str, default: Any, parse: Rule, optional: bool = False, blank_is_unset: bool = False) -> None:
        self.name = ""
        self.aliases = aliases
        self.default = default
        self.optional = optional or blank_is_unset
        self.blank_is_unset = blank_is_unset
        self.secret = parse is secret
        self.rule = parse

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def parse(self, raw: Any) -> Any:
        """The typed value of `raw`; ValueError(rule text) when it breaks the rule."""
        if raw is None and self.optional:
            return None
        if self.blank_is_unset and isinstance(raw, str) and not raw.strip():
            return None
        return self.rule(raw)


def setting(*aliases: str, default: Any = None, parse: Rule, optional: bool = False, blank_is_unset: bool = False) -> Any:
    """Declare a field (typed `Any` so the class annotations describe the instance attribute)."""
    return Field(*aliases, default=default, parse=parse, optional=optional, blank_is_unset=blank_is_unset)


#: The tenant everything lives in when neither a flag nor MOONMIND_TENANT names one.
DEFAULT_TENANT = "default"


class Settings:
    """Every setting, with its env alias(es) and rule (docs/configuration.md lists them all; a test keeps it in step)."""

    #: name -> Field (aliases, default, rule); filled in after the class body.
    model_fields: ClassVar[dict[str, Field]]

    # --- store -----------------------------------------------------------
    qdrant_url: str | None = setting("QDRANT_URL", parse=qdrant_url, blank_is_unset=True)
    qdrant_api_key: Secret | None = setting("QDRANT_API_KEY", parse=secret, optional=True)
    qdrant_timeout_s: float = setting("QDRANT_TIMEOUT_S", default=5.0, parse=number())
    moonmind_home: Path = setting("MOONMIND_HOME", default="~/.moonmind", parse=path)
    collection: str = setting("MOONMIND_COLLECTION", "QDRANT_COLLECTION", default="moonmind__repo", parse=text())
    store_wait_s: float = setting("MOONMIND_STORE_WAIT_S", default=3.0, parse=number(ge=0, le=600))
    #: who may read what moonmind writes under MOONMIND_HOME and the artifacts directory (modes.py)
    umask: int = setting("MOONMIND_UMASK", default="077", parse=octal_umask)
    #: auto: commands use the box's live owner of the embedded store, and start one in the background
    #: when none is alive; use: only an owner that is already alive; off: always run in this process
    #: (owner/client.py; docs/operations.md says when to choose which)
    owner_mode: Literal["use", "auto", "off"] = setting("MOONMIND_OWNER", default="auto", parse=choice("use", "auto", "off"))
    owner_idle_s: float = setting("MOONMIND_OWNER_IDLE_S", default=600.0, parse=number(gt=0))
    #: an auto-started owner that grew past this (after an index of a large tree) exits when idle;
    #: the next command starts a fresh one
    owner_max_rss_mb: float = setting("MOONMIND_OWNER_MAX_RSS_MB", default=1024.0, parse=number(gt=0))
    #: on: the owner watches every tree it indexed from a local path and re-indexes changed files
    #: (owner/freshness.py); off: nothing is watched, a search only says when its hits' files changed
    watch: Literal["on", "off"] = setting("MOONMIND_WATCH", default="on", parse=choice("on", "off"))

    # --- embedding -------------------------------------------------------
    embedding_provider: EmbeddingProvider = setting(
        "MOONMIND_EMBEDDING_PROVIDER", default="static", parse=choice("static", "openai", "google", "ollama", "cohere")
    )
    embedding_model: str | None = setting("MOONMIND_EMBEDDING_MODEL", parse=text(), optional=True)
    embedding_dimensions: int | None = setting("MOONMIND_EMBEDDING_DIMENSIONS", parse=integer(gt=0), optional=True)
    embedding_batch_size: int = setting("MOONMIND_EMBEDDING_BATCH_SIZE", default=64, parse=integer(gt=0))
    embedding_timeout_s: float = setting("MOONMIND_EMBEDDING_TIMEOUT_S", default=30.0, parse=number(gt=0))
    #: USD per million input tokens of the hosted model, for `rag index --dry-run`'s cost (unset: its table of list prices)
    embedding_price_per_mtok: float | None = setting("MOONMIND_EMBEDDING_PRICE_PER_MTOK", parse=number(ge=0), optional=True)
    google_api_key: Secret | None = setting("GOOGLE_API_KEY", parse=secret, optional=True)
    google_embedding_model: str | None = setting("GOOGLE_EMBEDDING_MODEL", parse=text(), optional=True)
    google_base_url: str = setting(
        "GOOGLE_OPENAI_BASE_URL", default="https://generativelanguage.googleapis.com/v1beta/openai/", parse=text()
    )
    openai_api_key: Secret | None = setting("OPENAI_API_KEY", parse=secret, optional=True)
    openai_base_url: str | None = setting("OPENAI_BASE_URL", parse=text(), blank_is_unset=True)
    ollama_url: str = setting("OLLAMA_URL", default="http://localhost:11434", parse=text())
    cohere_api_key: Secret | None = setting("COHERE_API_KEY", parse=secret, optional=True)
    cohere_base_url: str = setting("COHERE_BASE_URL", default="https://api.cohere.ai/compatibility/v1", parse=text())

    # --- retrieval -------------------------------------------------------
    top_k: int = setting("RAG_SIMILARITY_TOP_K", default=8, parse=integer(ge=1, le=50))
    score_threshold: float | None = setting("RAG_SCORE_THRESHOLD", parse=number(ge=0.0, le=1.0), optional=True)
    max_query_chars: int = setting("MOONMIND_MAX_QUERY_CHARS", default=2000, parse=integer(gt=0))

    # --- indexing --------------------------------------------------------
    chunk_chars: int = setting("MOONMIND_CHUNK_CHARS", default=1500, parse=integer(ge=200))
    chunk_overlap_lines: int = setting("MOONMIND_CHUNK_OVERLAP_LINES", default=2, parse=integer(ge=0))
    max_file_bytes: int = setting("MOONMIND_MAX_FILE_BYTES", default=1_000_000, parse=integer(gt=0))
    #: `on`: index gettext catalogs (.po, .pot) too; `off`: skip them (text.files.CATALOG_SUFFIXES says why)
    index_catalogs: Literal["on", "off"] = setting("MOONMIND_INDEX_CATALOGS", default="off", parse=choice("on", "off"))
    #: `on`: index secret files (.env, id_rsa, *.pem, credentials.json, ...) too; `off`: skip them (text.secrets)
    index_secret_files: Literal["on", "off"] = setting("MOONMIND_INDEX_SECRET_FILES", default="off",
                                                       parse=choice("on", "off"))
    #: `on`: secrets inside indexed text become `[redacted: KIND]` before chunking; `off`: stored as written
    redact_secrets: Literal["on", "off"] = setting("MOONMIND_REDACT_SECRETS", default="on", parse=choice("on", "off"))
    #: processes that chunk and embed beside the indexing one (static model only); unset: one per CPU
    #: on a multi-core machine, started once a run is large enough to pay for them; 0: in-process
    index_workers: int | None = setting("MOONMIND_INDEX_WORKERS", parse=integer(ge=0, le=64), optional=True)
    #: seconds between progress lines when stderr is not a terminal (a terminal gets a bar)
    progress_interval_s: float = setting("MOONMIND_PROGRESS_INTERVAL_S", default=5.0, parse=number(gt=0))

    # --- RetrievalGateway (client side and server side) ------------------
    retrieval_url: str | None = setting("MOONMIND_RETRIEVAL_URL", parse=text(), blank_is_unset=True)
    retrieval_token: Secret | None = setting("MOONMIND_RETRIEVAL_TOKEN", parse=secret, optional=True)
    retrieval_fallback: Literal["direct", "none"] = setting(
        "MOONMIND_RETRIEVAL_FALLBACK", default="direct", parse=choice("direct", "none")
    )
    gateway_tokens_file: Path | None = setting("MOONMIND_GATEWAY_TOKENS_FILE", parse=path, optional=True)
    # a connection must deliver a whole request (headers and body) within this long of opening
    # or of its previous response; idle or trickling connections are closed (gateway/uvicorn_adapter.py)
    gateway_read_timeout_s: float = setting("MOONMIND_GATEWAY_READ_TIMEOUT_S", default=10.0, parse=number(gt=0, le=600))
    #: who sees the repositories on /retrieval/status(.html): a bearer token, within its scope (scoped), or anyone (public)
    gateway_status: Literal["scoped", "public"] = setting("MOONMIND_GATEWAY_STATUS", default="scoped", parse=choice("scoped", "public"))

    # --- MCP server ------------------------------------------------------
    #: the workspace `moonmind mcp` reads relative paths against when the client sends no MCP roots
    #: (unset, and no roots: relative paths are refused; the server's own directory is the client's choice)
    workspace_root: Path | None = setting("MOONMIND_ROOT", parse=absolute_path, blank_is_unset=True)

    # --- job scope -------------------------------------------------------
    run_id: str | None = setting("MOONMIND_RUN_ID", parse=text(), optional=True)
    job_id: str | None = setting("MOONMIND_JOB_ID", parse=text(), optional=True)
    repo: str | None = setting("MOONMIND_REPO", parse=text(), optional=True)
    tenant: str | None = setting("MOONMIND_TENANT", parse=text(), optional=True)

    # --- Celery and queue events -------------------------------------------
    celery_broker_url: str = setting("CELERY_BROKER_URL", default="redis://localhost:6379/0", parse=text())
    celery_result_backend: str | None = setting("CELERY_RESULT_BACKEND", parse=text(), optional=True)
    events_url: str | None = setting("MOONMIND_EVENTS_URL", parse=text(), optional=True)
    events_timeout_s: float = setting("MOONMIND_EVENTS_TIMEOUT_S", default=0.5, parse=number(gt=0, le=10))
    rag_execution: Literal["sync", "queue"] = setting("MOONMIND_RAG_EXECUTION", default="sync", parse=choice("sync", "queue"))
    search_queue: str = setting("MOONMIND_SEARCH_QUEUE", default="moonmind.search", parse=text(min_length=1))
    index_queue: str = setting("MOONMIND_INDEX_QUEUE", default="moonmind.index", parse=text(min_length=1))
    queue_timeout_s: float = setting("MOONMIND_QUEUE_TIMEOUT_S", default=30.0, parse=number(gt=0))
    broker_visibility_timeout_s: float = setting("MOONMIND_BROKER_VISIBILITY_TIMEOUT_S", default=3600.0, parse=number(gt=0))
    overlay_sweep_interval_s: float = setting("MOONMIND_OVERLAY_SWEEP_INTERVAL_S", default=300.0, parse=number(gt=0))

    # --- observability (observe/metrics.py, observe/) --------------------
    statsd_host: str | None = setting("STATSD_HOST", parse=text(), blank_is_unset=True)
    statsd_port: int = setting("STATSD_PORT", default=8125, parse=integer(gt=0, lt=65536))
    statsd_prefix: str = setting("STATSD_PREFIX", default="moonmind", parse=text())
    artifacts_dir: Path | None = setting("MOONMIND_ARTIFACTS_DIR", parse=path, blank_is_unset=True)
    artifacts_retention_days: float = setting("MOONMIND_ARTIFACTS_RETENTION_DAYS", default=30.0, parse=number(ge=0))

    def __init__(self, _env_file: str | Path | None = ".env", _environ: bool = True, **values: Any) -> None:
        env = _environment(_env_file) if _environ else {}
        fields_set: set[str] = set()
        problems: list[tuple[Field, str, Any, str]] = []
        for name, field in self.model_fields.items():
            found = _lookup(field, values, env)
            if found is None:
                setattr(self, name, field.parse(field.default))
                continue
            key, raw, source = found
            fields_set.add(name)
            try:
                setattr(self, name, field.parse(raw))
            except ValueError:
                problems.append((field, key, raw, source))
        if problems:
            raise invalid_settings(problems)
        self._fields_set = fields_set

    @property
    def model_fields_set(self) -> set[str]:
        """Names of the fields given as keywords or found in the environment / `.env` (defaults excluded)."""
        return self._fields_set

    def model_copy(self, *, update: dict[str, Any] | None = None) -> Settings:
        """A copy with `update` applied (by field name, coerced by the same rules); the environment is not re-read."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new._fields_set = set(self._fields_set)
        problems = []
        for name, raw in (update or {}).items():
            field = self.model_fields.get(name)
            if field is None:
                raise AttributeError(f"Settings has no field {name!r}")
            try:
                setattr(new, name, field.parse(raw))
            except ValueError:
                problems.append((field, name, raw, "model_copy"))
            new._fields_set.add(name)
        if problems:
            raise invalid_settings(problems)
        return new

    def wire(self) -> dict[str, Any]:
        """The settings this process was given (not the defaults) as JSON, for a request to the box's owner.

        Why: an owner runs a client's operation as the client would have run it one-shot (its
        chunking, thresholds, artifacts directory, job scope); relative paths are made absolute
        because the owner's working directory is not the client's.
        """
        out: dict[str, Any] = {}
        for name in sorted(self._fields_set):
            value = getattr(self, name)
            if isinstance(value, Secret):
                value = value.get_secret_value()
            elif isinstance(value, Path):
                value = str(value.absolute())
            out[name] = value
        return out

    @classmethod
    def from_wire(cls, values: Any) -> Settings:
        """Settings made of `wire()`'s values alone: neither this process's environment nor its `.env` is read."""
        if not isinstance(values, dict) or not all(isinstance(k, str) and k in cls.model_fields for k in values):
            raise MoonmindError("invalid_argument", "The owner received settings it does not understand.",
                                "Use the same moonmind-worker version for the CLI and the owner.")
        return cls(_env_file=None, _environ=False, **values)

    def __repr__(self) -> str:
        return "Settings(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in self.model_fields) + ")"

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in self.model_fields)

    __hash__ = None  # type: ignore[assignment]  # mutable, like the pydantic model it replaces

    @property
    def result_backend(self) -> str:
        """Celery results live on Redis; the broker's Redis unless CELERY_RESULT_BACKEND says otherwise."""
        return self.celery_result_backend or self.celery_broker_url

    @property
    def configured_broker(self) -> str | None:
        """CELERY_BROKER_URL when set anywhere settings are read (environment, `.env`, keyword), else None.

        Why not the default URL: a laptop CLI with no broker configured must not try to reach
        localhost:6379 (for events, or in the doctor's checks) on its behalf.
        """
        return self.celery_broker_url if "celery_broker_url" in self.model_fields_set else None

    @property
    def events_broker(self) -> str | None:
        """Where queue events go: MOONMIND_EVENTS_URL, else the configured broker, else nowhere (a no-op)."""
        if self.events_url is not None:
            return None if self.events_url.strip().lower() in ("", "none", "off") else self.events_url
        return self.configured_broker

    @property
    def scope_tenant(self) -> str:
        """The tenant a command writes to and searches when none is given: MOONMIND_TENANT, else `default`.

        Why one place: index, overlay upsert, search and gateway tokens must agree, or a search
        silently misses what an index wrote under another tenant.
        """
        return self.tenant or DEFAULT_TENANT

    @property
    def model_name(self) -> str:
        """The embedding model actually in force for the configured provider."""
        if self.embedding_model:
            return self.embedding_model
        if self.embedding_provider == "google" and self.google_embedding_model:
            return self.google_embedding_model
        return DEFAULT_MODELS[self.embedding_provider]

    @property
    def embedded_store(self) -> bool:
        """True when the in-process Qdrant Edge store is in use (no QDRANT_URL)."""
        return self.qdrant_url is None

    @property
    def tokens_file(self) -> Path:
        """The gateway's bearer-token file (MOONMIND_GATEWAY_TOKENS_FILE, else under MOONMIND_HOME)."""
        return self.gateway_tokens_file or self.moonmind_home / "gateway-tokens.json"

    @property
    def data_dir(self) -> Path:
        return self.moonmind_home / "qdrant-edge"

    @property
    def artifacts_root(self) -> Path:
        """Where context packs and breadcrumbs are cached (one sub-directory per run)."""
        return self.artifacts_dir or self.moonmind_home / "artifacts"

    def secrets(self) -> list[str]:
        """Every configured secret value, so output can be scrubbed of them."""
        out = []
        for s in (self.qdrant_api_key, self.google_api_key, self.openai_api_key, self.cohere_api_key, self.retrieval_token):
            if s is not None and s.get_secret_value():
                out.append(s.get_secret_value())
        return out


Settings.model_fields = {n: f for n, f in vars(Settings).items() if isinstance(f, Field)}


def _environment(env_file: str | Path | None) -> dict[str, tuple[str, str, str]]:
    """UPPER-CASED name -> (name as written, value, where from); the real environment over `.env`."""
    env: dict[str, tuple[str, str, str]] = {}
    if env_file is not None and Path(env_file).is_file():
        from dotenv import dotenv_values

        for k, v in dotenv_values(env_file).items():
            if v is not None:
                env[k.upper()] = (k, v, str(env_file))
    for k, v in os.environ.items():
        env[k.upper()] = (k, v, "the environment")
    return env


def _lookup(field: Field, values: dict[str, Any], env: dict[str, tuple[str, str, str]]) -> tuple[str, Any, str] | None:
    """(key as given, raw value, where from) for `field`: a keyword (alias, then name), else the environment."""
    for key in (*field.aliases, field.name):
        if key in values:
            return key, values[key], "a keyword argument"
    for alias in field.aliases:
        if alias.upper() in env:
            return env[alias.upper()]
    return None


def invalid_settings(problems: list[tuple[Field, str, Any, str]]) -> MoonmindError:
    """One error naming each bad variable, its value (never a secret's), where it came from, and the rule."""
    messages, actions = [], []
    for field, key, raw, source in problems:
        shown = key if field.secret else f"{key}={raw!r}"
        messages.append(f"{shown} (from {source}) must be {field.rule.text}")
        default = "" if field.default is None else f" (default {field.default})"
        actions.append(f"Set {key} to {field.rule.text}, or unset it{default}.")
    message = redact(("Invalid setting: " if len(problems) == 1 else "Invalid settings: ") + "; ".join(messages) + ".")
    return MoonmindError("invalid_setting", message, " ".join(actions), settings=[key for _, key, _, _ in problems])


@lru_cache(maxsize=1)
def _process_settings() -> Settings:
    return Settings()


#: The settings of the request this thread serves for a client (the owner's `serving`), if any.
_request_settings: ContextVar[Settings | None] = ContextVar("moonmind_request_settings", default=None)


def get_settings() -> Settings:
    """The settings in force: the client's while an owner serves its request, else this process's, read once."""
    return _request_settings.get() or _process_settings()


get_settings.cache_clear = _process_settings.cache_clear  # type: ignore[attr-defined]


@contextmanager
def serving(settings: Settings) -> Iterator[Settings]:
    """Run a client's request under its own settings: metrics, events and artifacts read them, not the owner's."""
    token = _request_settings.set(settings)
    try:
        yield settings
    finally:
        _request_settings.reset(token)
