"""One settings object, read once from the environment and `.env`.

Why one object: every entry point (CLI, Celery task, gateway) must agree on the
collection, the embedding model and the store, or retrieval silently degrades.

Why not pydantic-settings: importing it costs ~0.2 s of CPU per process (asyncio,
pydantic dataclasses, every cloud source), a third of the whole `rag search`
budget. The rules it applied are kept exactly: each field is read from its env
alias(es), case-insensitively; the real environment beats `.env`; keyword
arguments (field name or alias) beat both; `_env_file=None` skips `.env`.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, SecretStr, field_validator

EmbeddingProvider = Literal["static", "openai", "google", "ollama"]

#: Default model per provider, used when MOONMIND_EMBEDDING_MODEL is unset.
DEFAULT_MODELS: dict[str, str] = {
    "static": "moonmind-static-minilm-256",
    "openai": "text-embedding-3-small",
    "google": "gemini-embedding-001",
    "ollama": "nomic-embed-text",
}


class Settings(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    def __init__(self, _env_file: str | Path | None = ".env", **values: Any) -> None:
        super().__init__(**_with_environment(type(self), values, _env_file))

    # --- store -----------------------------------------------------------
    qdrant_url: str | None = Field(None, validation_alias="QDRANT_URL")
    qdrant_api_key: SecretStr | None = Field(None, validation_alias="QDRANT_API_KEY")
    qdrant_timeout_s: float = Field(5.0, validation_alias="QDRANT_TIMEOUT_S")
    moonmind_home: Path = Field(Path("~/.moonmind"), validation_alias="MOONMIND_HOME")
    collection: str = Field(
        "moonmind__repo", validation_alias=AliasChoices("MOONMIND_COLLECTION", "QDRANT_COLLECTION")
    )

    # --- embedding -------------------------------------------------------
    embedding_provider: EmbeddingProvider = Field("static", validation_alias="MOONMIND_EMBEDDING_PROVIDER")
    embedding_model: str | None = Field(None, validation_alias="MOONMIND_EMBEDDING_MODEL")
    embedding_dimensions: int | None = Field(None, validation_alias="MOONMIND_EMBEDDING_DIMENSIONS", gt=0)
    embedding_batch_size: int = Field(64, validation_alias="MOONMIND_EMBEDDING_BATCH_SIZE", gt=0)
    embedding_timeout_s: float = Field(30.0, validation_alias="MOONMIND_EMBEDDING_TIMEOUT_S", gt=0)
    google_api_key: SecretStr | None = Field(None, validation_alias="GOOGLE_API_KEY")
    google_embedding_model: str | None = Field(None, validation_alias="GOOGLE_EMBEDDING_MODEL")
    google_base_url: str = Field(
        "https://generativelanguage.googleapis.com/v1beta/openai/", validation_alias="GOOGLE_OPENAI_BASE_URL"
    )
    openai_api_key: SecretStr | None = Field(None, validation_alias="OPENAI_API_KEY")
    openai_base_url: str | None = Field(None, validation_alias="OPENAI_BASE_URL")
    ollama_url: str = Field("http://localhost:11434", validation_alias="OLLAMA_URL")

    # --- retrieval -------------------------------------------------------
    top_k: int = Field(8, validation_alias="RAG_SIMILARITY_TOP_K", ge=1, le=50)
    score_threshold: float | None = Field(None, validation_alias="RAG_SCORE_THRESHOLD", ge=0.0, le=1.0)
    max_query_chars: int = Field(2000, validation_alias="MOONMIND_MAX_QUERY_CHARS", gt=0)

    # --- indexing --------------------------------------------------------
    chunk_chars: int = Field(1500, validation_alias="MOONMIND_CHUNK_CHARS", ge=200)
    chunk_overlap_lines: int = Field(2, validation_alias="MOONMIND_CHUNK_OVERLAP_LINES", ge=0)
    max_file_bytes: int = Field(1_000_000, validation_alias="MOONMIND_MAX_FILE_BYTES", gt=0)

    # --- RetrievalGateway (client side and server side) ------------------
    retrieval_url: str | None = Field(None, validation_alias="MOONMIND_RETRIEVAL_URL")
    retrieval_token: SecretStr | None = Field(None, validation_alias="MOONMIND_RETRIEVAL_TOKEN")
    retrieval_fallback: Literal["direct", "none"] = Field("direct", validation_alias="MOONMIND_RETRIEVAL_FALLBACK")
    gateway_tokens_file: Path | None = Field(None, validation_alias="MOONMIND_GATEWAY_TOKENS_FILE")

    # --- job scope -------------------------------------------------------
    run_id: str | None = Field(None, validation_alias="MOONMIND_RUN_ID")
    job_id: str | None = Field(None, validation_alias="MOONMIND_JOB_ID")
    repo: str | None = Field(None, validation_alias="MOONMIND_REPO")
    tenant: str | None = Field(None, validation_alias="MOONMIND_TENANT")

    # --- Celery and queue events -------------------------------------------
    celery_broker_url: str = Field("redis://localhost:6379/0", validation_alias="CELERY_BROKER_URL")
    celery_result_backend: str | None = Field(None, validation_alias="CELERY_RESULT_BACKEND")
    events_url: str | None = Field(None, validation_alias="MOONMIND_EVENTS_URL")
    events_timeout_s: float = Field(0.5, validation_alias="MOONMIND_EVENTS_TIMEOUT_S", gt=0, le=10)
    rag_execution: Literal["sync", "queue"] = Field("sync", validation_alias="MOONMIND_RAG_EXECUTION")
    search_queue: str = Field("moonmind.search", validation_alias="MOONMIND_SEARCH_QUEUE", min_length=1)
    index_queue: str = Field("moonmind.index", validation_alias="MOONMIND_INDEX_QUEUE", min_length=1)
    queue_timeout_s: float = Field(30.0, validation_alias="MOONMIND_QUEUE_TIMEOUT_S", gt=0)
    broker_visibility_timeout_s: float = Field(3600.0, validation_alias="MOONMIND_BROKER_VISIBILITY_TIMEOUT_S", gt=0)
    overlay_sweep_interval_s: float = Field(300.0, validation_alias="MOONMIND_OVERLAY_SWEEP_INTERVAL_S", gt=0)

    # --- observability (metrics.py, observe.py) ---------------------------
    statsd_host: str | None = Field(None, validation_alias="STATSD_HOST")
    statsd_port: int = Field(8125, validation_alias="STATSD_PORT", gt=0, lt=65536)
    statsd_prefix: str = Field("moonmind", validation_alias="STATSD_PREFIX")
    artifacts_dir: Path | None = Field(None, validation_alias="MOONMIND_ARTIFACTS_DIR")

    @field_validator("moonmind_home", "gateway_tokens_file", mode="after")
    @classmethod
    def _expand_home(cls, v: Path | None) -> Path | None:
        return v.expanduser() if v is not None else None

    @field_validator("artifacts_dir", mode="before")
    @classmethod
    def _expand_artifacts(cls, v: object) -> object:
        if isinstance(v, str):
            return Path(v).expanduser() if v.strip() else None
        return v

    @field_validator("qdrant_url", "openai_base_url", "statsd_host", "retrieval_url", mode="after")
    @classmethod
    def _blank_is_unset(cls, v: str | None) -> str | None:
        return v or None

    @property
    def result_backend(self) -> str:
        """Celery results live on Redis; the broker's Redis unless CELERY_RESULT_BACKEND says otherwise."""
        return self.celery_result_backend or self.celery_broker_url

    @property
    def events_broker(self) -> str | None:
        """Where queue events go: MOONMIND_EVENTS_URL, else an explicitly configured CELERY_BROKER_URL, else nowhere.

        Why not the default broker URL: a laptop CLI with no broker configured must not
        try to reach localhost:6379 on every search; events are then a no-op.
        """
        if self.events_url is not None:
            return None if self.events_url.strip().lower() in ("", "none", "off") else self.events_url
        if "celery_broker_url" in self.model_fields_set:
            return self.celery_broker_url
        return None

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
        for s in (self.qdrant_api_key, self.google_api_key, self.openai_api_key, self.retrieval_token):
            if s is not None and s.get_secret_value():
                out.append(s.get_secret_value())
        return out


def _aliases(field) -> list[str]:
    alias = field.validation_alias
    if isinstance(alias, str):
        return [alias]
    if isinstance(alias, AliasChoices):
        return [a for a in alias.choices if isinstance(a, str)]
    return []


def _with_environment(cls: type[BaseModel], values: dict[str, Any], env_file: str | Path | None) -> dict[str, Any]:
    """`values` plus, for every field not given, its value from the environment or `.env`."""
    env: dict[str, str] = {}
    if env_file is not None and Path(env_file).is_file():
        from dotenv import dotenv_values

        env.update((k.upper(), v) for k, v in dotenv_values(env_file).items() if v is not None)
    env.update((k.upper(), v) for k, v in os.environ.items())
    out = dict(values)
    for name, field in cls.model_fields.items():
        aliases = _aliases(field)
        if name in values or any(a in values for a in aliases):
            continue
        for alias in aliases:
            if alias.upper() in env:
                out[alias] = env[alias.upper()]
                break
    return out


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once."""
    return Settings()
