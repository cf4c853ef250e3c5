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
from ..errors import MoonmindError
from .base import _unit

if TYPE_CHECKING:
    import numpy as np


#: The setting that holds each provider's key, named in the remedy when the provider rejects it.
CREDENTIALS = {"openai": "OPENAI_API_KEY", "google": "GOOGLE_API_KEY", "cohere": "COHERE_API_KEY"}


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
        self._client = openai.OpenAI(api_key=api_key, base_url=base_url, timeout=timeout_s, max_retries=0,
                                     http_client=openai.DefaultHttpxClient(transport=_bounded_transport(openai, timeout_s)))
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
        from ..retry import call_with_retries

        kwargs: dict[str, Any] = {"dimensions": self._requested_dims} if self._requested_dims else {}

        def call() -> np.ndarray:
            extra: dict[str, Any] = {}
            if deadline is not None:  # each attempt waits at most what is left of the latency budget
                extra["timeout"] = max(deadline - time.monotonic(), 0.001)
            resp = self._client.embeddings.create(model=self.name, input=texts, **kwargs, **extra)
            return self._checked(resp.data, len(texts), what)

        what = f"{self.provider} embeddings ({self.name})"
        return call_with_retries(call, what=what, deadline=deadline, credential=CREDENTIALS.get(self.provider))

    def _checked(self, data: list[Any], expected: int, what: str) -> np.ndarray:
        """The answer's vectors in input order, or `embedding_provider_error` naming what is wrong with them.

        Why: a vector stored is searched for as long as the index lives; one NaN in it makes every score
        with it NaN, a wrong size fails deep in the store, and a missing one would drop a chunk silently.
        """
        import numpy as np

        def bad(problem: str) -> MoonmindError:
            return MoonmindError("embedding_provider_error", f"{what}: the provider's answer {problem}.",
                                 "Check that the provider and model are the ones configured (MOONMIND_EMBEDDING_MODEL, "
                                 "the base URL); nothing was stored from this answer.")

        indices = sorted(i for d in data if isinstance(i := getattr(d, "index", None), int))
        if len(data) != expected or indices != list(range(expected)):
            raise bad(f"holds {len(data)} vectors (indices {indices[:5]}{'…' if len(indices) > 5 else ''}) for {expected} inputs")
        rows = sorted(data, key=lambda d: d.index)
        sizes = {len(r.embedding) for r in rows}
        if len(sizes) != 1:
            raise bad(f"mixes vectors of {len(sizes)} sizes ({', '.join(map(str, sorted(sizes)[:4]))})")
        size = sizes.pop()
        if size == 0 or (self._dims is not None and size != self._dims):
            raise bad(f"has vectors of {size} dimensions where this model gives {self._dims}")
        out = np.asarray([r.embedding for r in rows], dtype=np.float32)
        if not np.isfinite(out).all():
            raise bad("holds a value that is not a finite number (NaN or infinity)")
        if not np.any(out, axis=1).all():
            raise bad("holds an all-zero vector, which has no direction to search by")
        return out

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


#: The largest answer read from a provider: a batch of 64 inputs at 3,072 dimensions is ~4 MB as JSON floats.
MAX_ANSWER_BYTES = 32 << 20


def _bounded_transport(openai: Any, timeout_s: float) -> Any:
    """An httpx transport whose answers stop at MAX_ANSWER_BYTES and at `timeout_s` after the request in all.

    Why: httpx's timeout bounds each read, so an answer that keeps trickling (or is huge) held a search or
    an index run for minutes. Past the size it is an error naming it; past the time, a read timeout (retried).
    Built on the HTTP library the `openai` package itself uses (httpx, or its successor httpx2).
    """
    import importlib

    httpx: Any = importlib.import_module(openai.DefaultHttpxClient.__mro__[1].__module__.partition(".")[0])

    class Bounded(httpx.SyncByteStream):
        def __init__(self, inner: Any, deadline: float) -> None:
            self._inner, self._deadline = inner, deadline

        def __iter__(self) -> Any:
            seen = 0
            for chunk in self._inner:
                seen += len(chunk)
                if seen > MAX_ANSWER_BYTES:
                    raise MoonmindError("embedding_provider_error",
                                        f"The embedding provider's answer is larger than {MAX_ANSWER_BYTES >> 20} MiB.",
                                        "Check the provider URL: it does not answer like an embeddings API. Nothing was stored.")
                if time.monotonic() > self._deadline:
                    raise httpx.ReadTimeout(f"the answer took longer than {timeout_s:g} s in all")
                yield chunk

        def close(self) -> None:
            self._inner.close()

    class Transport(httpx.HTTPTransport):
        def handle_request(self, request: Any) -> Any:
            deadline = time.monotonic() + timeout_s
            response = super().handle_request(request)
            response.stream = Bounded(response.stream, deadline)
            return response

    return Transport()


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
