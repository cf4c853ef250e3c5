"""The embedding seam: texts in, unit vectors out, and the text preparation every provider shares."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Protocol, Sequence

if TYPE_CHECKING:
    import numpy as np

_WS = re.compile(r"\s+")


_LOWER_UPPER = re.compile(r"([a-z0-9])([A-Z])")  # two plain passes: faster than one lookaround regex
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

    def embed_query(self, text: str, deadline: float | None = None) -> np.ndarray | Sequence[float]:
        """A unit float32 vector (a numpy array, or an `array('f')` from the static model's numpy-free path);
        `deadline` (time.monotonic) bounds the call, retries included: a latency budget."""
        ...


def _unit(rows: np.ndarray) -> np.ndarray:
    import numpy as np

    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return (rows / norms).astype(np.float32, copy=False)
