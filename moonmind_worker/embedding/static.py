"""The offline default: a static model (model2vec format) that ships inside the package.

Distilled from all-MiniLM-L6-v2 by `scripts/build_static_model.py`; runs on numpy +
tokenizers: no download, no torch, thousands of chunks per second.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .. import observe
from .base import _unit, split_identifiers

STATIC_MODEL_DIR = Path(__file__).parent.parent / "models" / "static-minilm-256"


class StaticEmbedder:
    """Mean of per-token static vectors, L2-normalised (model2vec inference, in numpy)."""

    def __init__(self, model_dir: Path = STATIC_MODEL_DIR, name: str | None = None) -> None:
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        config = json.loads((model_dir / "config.json").read_text())
        self.model_dir = model_dir  # what index worker processes load (indexing/workers.py)
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
