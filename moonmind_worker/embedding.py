"""Embedding providers behind one small interface: texts in, unit vectors out.

The offline default is a static model (model2vec format, distilled from
all-MiniLM-L6-v2 by `scripts/build_static_model.py`) that ships inside the
package and runs on numpy + tokenizers: no download, no torch, thousands of
chunks per second. Hosted providers (OpenAI, Gemini, Ollama) all speak the
OpenAI embeddings protocol, so one adapter on the `openai` package covers them.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Protocol

import numpy as np

from . import observe
from .errors import MoonmindError
from .settings import Settings

STATIC_MODEL_DIR = Path(__file__).parent / "models" / "static-minilm-256"

_WS = re.compile(r"\s+")


_LOWER_UPPER = re.compile(r"([a-z0-9])([A-Z])")  # two plain passes: ~30% faster than one lookaround regex
_ACRONYM_WORD = re.compile(r"([A-Z])([A-Z][a-z])")


def split_identifiers(text: str) -> str:
    """`getStreamChunkSize` -> `get Stream Chunk Size`, `HTTPServer` -> `HTTP Server`, for a static model.

    Why: the model's uncased word-piece vocabulary cuts a camelCase run into fragments
    (`getstreamchunksize` -> `gets ##tream ##chunk ##size`) whose vectors mean little; split at
    the case boundaries, every part is a word the model knows, as in the question that names it.
    snake_case needs nothing: the tokenizer already splits at `_`.
    """
    return _ACRONYM_WORD.sub(r"\1 \2", _LOWER_UPPER.sub(r"\1 \2", text))


def normalize_whitespace(text: str) -> str:
    return _WS.sub(" ", text).strip()


class Embedder(Protocol):
    """What the indexer and the retriever need from a model."""

    name: str

    @property
    def dimensions(self) -> int: ...

    def embed_documents(self, texts: list[str]) -> np.ndarray: ...

    def embed_query(self, text: str, deadline: float | None = None) -> np.ndarray:
        """`deadline` (time.monotonic) bounds the call, retries included: a latency budget."""
        ...


def _unit(rows: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return (rows / norms).astype(np.float32, copy=False)


class StaticEmbedder:
    """Mean of per-token static vectors, L2-normalised (model2vec inference, in numpy)."""

    def __init__(self, model_dir: Path = STATIC_MODEL_DIR, name: str | None = None) -> None:
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        config = json.loads((model_dir / "config.json").read_text())
        self.model_dir = model_dir  # what index worker processes load (index_workers)
        self.name = name or config["name"]
        # kept as stored (float16): rows are widened to float32 when used, which gives the very
        # same values as widening the whole table, without paying for it on every process start
        self._vectors = load_file(str(model_dir / "embeddings.safetensors"))["embeddings"]
        self._tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(512)
        self._unk = self._tokenizer.token_to_id("[UNK]")

    @property
    def dimensions(self) -> int:
        return int(self._vectors.shape[1])

    @observe.embed
    def embed_documents(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimensions), dtype=np.float32)
        encodings = self._tokenizer.encode_batch_fast([split_identifiers(t) for t in texts], add_special_tokens=False)
        return _unit(np.vstack([self._mean_rows(encodings[i : i + 256]) for i in range(0, len(encodings), 256)]))

    def _mean_rows(self, encodings: list) -> np.ndarray:
        """Mean token vector per text, as (token counts per text) @ (vectors of the distinct tokens).

        Why a product: gathering one 256-float row per token and summing moved ~1 KB per
        token through memory; counting tokens first touches each distinct row once.
        """
        n = len(encodings)
        ids = [np.asarray(enc.ids, dtype=np.int64) for enc in encodings]
        flat = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)
        text = np.repeat(np.arange(n), [len(a) for a in ids])
        known = flat != self._unk
        flat, text = flat[known], text[known]
        out = np.zeros((n, self.dimensions), dtype=np.float32)
        if not flat.size:
            return out
        rows, slot = np.unique(flat, return_inverse=True)
        counts = np.bincount(text * len(rows) + slot, minlength=n * len(rows)).reshape(n, len(rows))
        lengths = counts.sum(axis=1)
        sums = counts.astype(np.float32) @ self._vectors[rows].astype(np.float32)
        nonempty = lengths > 0
        out[nonempty] = sums[nonempty] / lengths[nonempty, None]
        return out

    def embed_query(self, text: str, deadline: float | None = None) -> np.ndarray:
        """In-process and sub-millisecond: nothing to bound, the caller checks the deadline after."""
        return self.embed_documents([text])[0]


class OpenAICompatibleEmbedder:
    """OpenAI, Gemini (OpenAI-compatible endpoint) and Ollama (`/v1`) through the `openai` package."""

    def __init__(
        self,
        name: str,
        api_key: str,
        base_url: str | None,
        provider: str,
        dimensions: int | None,
        timeout_s: float,
        batch_size: int,
        cache_dir: Path,
    ) -> None:
        import openai

        self.name = name
        self.provider = provider
        self._requested_dims = dimensions
        self._batch_size = batch_size
        self._cache_file = cache_dir / "embedding-dimensions.json"
        self._client = openai.OpenAI(api_key=api_key, base_url=base_url, timeout=timeout_s, max_retries=0)
        self._dims: int | None = None

    @property
    def dimensions(self) -> int:
        """The model's actual output size: asked of the model once, then cached per model."""
        if self._dims is None:
            cache = _read_json(self._cache_file)
            key = f"{self.provider}:{self.name}:{self._requested_dims or ''}"
            if key in cache:
                self._dims = int(cache[key])
            else:
                self._dims = int(self._embed_batch(["dimension probe"]).shape[1])
                cache[key] = self._dims
                _write_json(self._cache_file, cache)
        return self._dims

    @observe.embed
    def _embed_batch(self, texts: list[str], deadline: float | None = None) -> np.ndarray:
        from .retry import call_with_retries

        kwargs: dict = {"dimensions": self._requested_dims} if self._requested_dims else {}

        def call() -> np.ndarray:
            extra = {}
            if deadline is not None:  # each attempt waits at most what is left of the latency budget
                extra["timeout"] = max(deadline - time.monotonic(), 0.001)
            resp = self._client.embeddings.create(model=self.name, input=texts, **kwargs, **extra)
            rows = sorted(resp.data, key=lambda d: d.index)
            return np.asarray([r.embedding for r in rows], dtype=np.float32)

        return call_with_retries(call, what=f"{self.provider} embeddings ({self.name})", deadline=deadline)

    def embed_documents(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimensions), dtype=np.float32)
        parts = [self._embed_batch(texts[i : i + self._batch_size]) for i in range(0, len(texts), self._batch_size)]
        out = _unit(np.vstack(parts))
        self._dims = self._dims or int(out.shape[1])
        return out

    def embed_query(self, text: str, deadline: float | None = None) -> np.ndarray:
        out = _unit(self._embed_batch([text], deadline))
        self._dims = self._dims or int(out.shape[1])
        return out[0]


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


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{time.time_ns()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    tmp.replace(path)
