"""Embedding providers behind one small interface: texts in, unit vectors out.

The offline default is a static model (model2vec format, distilled from
all-MiniLM-L6-v2 by `scripts/build_static_model.py`) that ships inside the
package and runs on numpy + tokenizers: no download, no torch, thousands of
chunks per second. Hosted providers (OpenAI, Gemini, Ollama) all speak the
OpenAI embeddings protocol, so one adapter on the `openai` package covers them.
"""

from __future__ import annotations

from ..errors import MoonmindError
from ..settings import Settings
from .base import Embedder, normalize_whitespace, split_identifiers
from .openai_compatible import OpenAICompatibleEmbedder
from .static import STATIC_MODEL_DIR, StaticEmbedder

__all__ = [
    "STATIC_MODEL_DIR", "Embedder", "OpenAICompatibleEmbedder", "StaticEmbedder", "make_embedder",
    "normalize_whitespace", "split_identifiers",
]


def make_embedder(settings: Settings) -> Embedder:
    """Build the configured provider, refusing early when its credential is missing."""
    provider = settings.embedding_provider
    if provider == "static":
        if settings.embedding_model and settings.embedding_model != "moonmind-static-minilm-256":
            raise MoonmindError(
                "invalid_argument",
                f"Unknown static model {settings.embedding_model!r}.",
                "Unset MOONMIND_EMBEDDING_MODEL or set it to moonmind-static-minilm-256.",
            )
        return StaticEmbedder()
    base: str | None
    if provider == "ollama":
        base = settings.ollama_url.rstrip("/") + "/v1"
        key = "ollama"
    elif provider == "google":
        key = _required(settings.google_api_key, "GOOGLE_API_KEY", "Gemini embeddings")
        base = settings.google_base_url
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
    )


def _required(secret, var: str, what: str) -> str:
    if secret is None or not secret.get_secret_value():
        raise MoonmindError(
            "missing_credentials",
            f"{var} is not set; {what} need it (read from the environment or a .env file in the working directory).",
            f"Export {var} or add it to .env, or set MOONMIND_EMBEDDING_PROVIDER=static for the offline model.",
        )
    return secret.get_secret_value()
