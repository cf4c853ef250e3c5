"""Hosted providers (OpenAI, Gemini, Ollama, Cohere): they all speak the OpenAI embeddings protocol.

One adapter on the `openai` package covers them; the dimension a model answers with is
cached under MOONMIND_HOME so a later process need not ask again.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import observe
from .base import _unit

if TYPE_CHECKING:
    import numpy as np


class OpenAICompatibleEmbedder:
    """OpenAI, Gemini and Cohere (OpenAI-compatible endpoints) and Ollama (`/v1`) through the `openai` package."""

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
        known_dimensions: int | None = None,
    ) -> None:
        import openai

        self.name = name
        self.provider = provider
        self._requested_dims = dimensions
        self._batch_size = batch_size
        self._cache_file = cache_dir / "embedding-dimensions.json"
        self._client = openai.OpenAI(api_key=api_key, base_url=base_url, timeout=timeout_s, max_retries=0)
        self._dims: int | None = known_dimensions  # a preset's published size needs no probe

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
        import numpy as np

        from ..retry import call_with_retries

        kwargs: dict[str, Any] = {"dimensions": self._requested_dims} if self._requested_dims else {}

        def call() -> np.ndarray:
            extra: dict[str, Any] = {}
            if deadline is not None:  # each attempt waits at most what is left of the latency budget
                extra["timeout"] = max(deadline - time.monotonic(), 0.001)
            resp = self._client.embeddings.create(model=self.name, input=texts, **kwargs, **extra)
            rows = sorted(resp.data, key=lambda d: d.index)
            return np.asarray([r.embedding for r in rows], dtype=np.float32)

        return call_with_retries(call, what=f"{self.provider} embeddings ({self.name})", deadline=deadline)

    def embed_documents(self, texts: list[str]) -> np.ndarray:
        import numpy as np

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
