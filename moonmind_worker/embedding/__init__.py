"""Embedding providers behind one small interface: texts in, unit vectors out.

The offline default is a static model (model2vec format, distilled from
all-MiniLM-L6-v2 by `scripts/build_static_model.py`, then trained on code by
`training/train.py`) that ships inside the package and runs on numpy + tokenizers: no download, no torch, thousands of
chunks per second. Hosted providers (OpenAI, Gemini, Ollama, Cohere) all speak the
OpenAI embeddings protocol, so one adapter on the `openai` package covers them.
"""

from __future__ import annotations

from ..errors import MoonmindError
from ..settings import Settings
from .base import Embedder, normalize_whitespace, split_identifiers
from .openai_compatible import OpenAICompatibleEmbedder
from .presets import known_dimensions
from .static import RETIRED_STATIC_MODELS, STATIC_MODEL_DIR, STATIC_MODEL_NAME, StaticEmbedder

__all__ = [
    "RETIRED_STATIC_MODELS", "STATIC_MODEL_DIR", "STATIC_MODEL_NAME", "Embedder", "OpenAICompatibleEmbedder",
    "StaticEmbedder", "make_embedder", "normalize_whitespace", "split_identifiers",
]


def make_embedder(settings: Settings) -> Embedder:
    """Build the configured provider, refusing early when its credential is missing."""
    provider = settings.embedding_provider
    if provider == "static":
        if settings.embedding_model in RETIRED_STATIC_MODELS:
            raise MoonmindError(
                "invalid_argument",
                f"The static model {settings.embedding_model!r} is no longer shipped; this release embeds with "
                f"{STATIC_MODEL_NAME}.",
                "Unset MOONMIND_EMBEDDING_MODEL, then run `moonmind rag sync-embedding` to re-embed what the old "
                "model indexed.",
            )
        if settings.embedding_model and settings.embedding_model != STATIC_MODEL_NAME:
            raise MoonmindError(
                "invalid_argument",
                f"Unknown static model {settings.embedding_model!r}.",
                f"Unset MOONMIND_EMBEDDING_MODEL or set it to {STATIC_MODEL_NAME}.",
            )
        return StaticEmbedder()
    base: str | None
    if provider == "ollama":
        base = settings.ollama_url.rstrip("/") + "/v1"
        key = "ollama"
    elif provider == "google":
        key = _required(settings.google_api_key, "GOOGLE_API_KEY", "Gemini embeddings")
        base = settings.google_base_url
    elif provider == "cohere":  # Cohere's OpenAI-compatible endpoint (embedding/presets.py)
        key = _required(settings.cohere_api_key, "COHERE_API_KEY", "Cohere embeddings")
        base = settings.cohere_base_url
    else:
        key = _required(settings.openai_api_key, "OPENAI_API_KEY", "OpenAI-compatible embeddings")
        base = settings.openai_base_url
    return OpenAICompatibleEmbedder(
        name=settings.model_name,
        api_key=key,
        base_url=base,
        provider=provider,
        dimensions=settings.embedding_dimensions,
        timeout_s=settings.embedding_timeout_s,
        batch_size=settings.embedding_batch_size,
        cache_dir=settings.moonmind_home,
        known_dimensions=known_dimensions(provider, settings.model_name, settings.embedding_dimensions),
    )


def _required(secret, var: str, what: str) -> str:
    if secret is None or not secret.get_secret_value():
        raise MoonmindError(
            "missing_credentials",
            f"{var} is not set; {what} need it (read from the environment or a .env file in the working directory).",
            f"Export {var} or add it to .env, or set MOONMIND_EMBEDDING_PROVIDER=static for the offline model.",
        )
    return secret.get_secret_value()
