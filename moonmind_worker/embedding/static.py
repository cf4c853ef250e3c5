"""The offline default: a static model (model2vec format) that ships inside the package.

Distilled from all-MiniLM-L6-v2 by `scripts/build_static_model.py`, then trained on code by
`training/train.py`; runs on numpy + tokenizers: no download, no torch, thousands of chunks per second.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from .. import observe
from .base import _unit, split_identifiers

if TYPE_CHECKING:
    import numpy as np

    from .static_query import StaticQueryModel

STATIC_MODEL_DIR = Path(__file__).parent.parent / "models" / "static-code-256"
STATIC_MODEL_NAME = "moonmind-static-code-256"
#: Static models earlier releases shipped: a collection they embedded needs `rag sync-embedding`.
RETIRED_STATIC_MODELS = frozenset({"moonmind-static-minilm-256"})


class StaticEmbedder:
    """Mean of per-token static vectors, L2-normalised (model2vec inference, in numpy).

    The model (numpy, tokenizers, the float16 table) loads on first use by `embed_documents`;
    a query in a process that has not loaded numpy goes through `static_query` instead, which
    gives the same bits without loading any of it (a one-shot `rag search`).
    """

    def __init__(self, model_dir: Path = STATIC_MODEL_DIR, name: str | None = None) -> None:
        config = json.loads((model_dir / "config.json").read_text())
        self.model_dir = model_dir  # what index worker processes load (indexing/workers.py)
        self.name = name or config["name"]
        self._dims = int(config["dimensions"])
        self._model: tuple | None = None  # (vectors, tokenizer, unk id, token id cache): see _loaded
        self._query_model: StaticQueryModel | None = None  # made on a numpy-free query

    def _loaded(self) -> tuple:
        if self._model is None:
            from safetensors.numpy import load_file
            from tokenizers import Tokenizer

            from .token_cache import TokenIdCache

            # kept as stored (float16): rows are widened to float32 when used, which gives the very
            # same values as widening the whole table, without paying for it on every process start
            vectors = load_file(str(self.model_dir / "embeddings.safetensors"))["embeddings"]
            tokenizer = Tokenizer.from_file(str(self.model_dir / "tokenizer.json"))
            tokenizer.no_padding()
            tokenizer.enable_truncation(512)
            self._model = (vectors, tokenizer, tokenizer.token_to_id("[UNK]"), TokenIdCache(tokenizer, 512))
        return self._model

    @property
    def _vectors(self):
        return self._loaded()[0]

    @property
    def _tokenizer(self):
        return self._loaded()[1]

    @property
    def _unk(self) -> int:
        return self._loaded()[2]

    @property
    def dimensions(self) -> int:
        return self._dims

    @observe.embed
    def embed_documents(self, texts: list[str]) -> np.ndarray:
        import numpy as np

        if not texts:
            return np.zeros((0, self.dimensions), dtype=np.float32)
        ids = self._loaded()[3].encode(texts)
        return _unit(np.vstack([self._mean_rows(ids[i : i + 256]) for i in range(0, len(ids), 256)]))

    def _mean_rows(self, ids: list[bytes]) -> np.ndarray:
        """Mean token vector per text (ids as uint32 bytes), as (token counts per text) @ (vectors of the distinct tokens).

        Why a product: gathering one 256-float row per token and summing moved ~1 KB per
        token through memory; counting tokens first touches each distinct row once. The distinct
        tokens are found with a table over the vocabulary rather than a sort (`np.unique`): the
        same rows in the same order and the same slots, so the same product, bit for bit.
        """
        import numpy as np

        n = len(ids)
        flat = np.frombuffer(b"".join(ids), dtype="<u4").astype(np.intp)
        text = np.repeat(np.arange(n), [len(b) // 4 for b in ids])
        known = flat != self._unk
        flat, text = flat[known], text[known]
        out = np.zeros((n, self.dimensions), dtype=np.float32)
        if not flat.size:
            return out
        vectors = self._vectors
        present = np.zeros(len(vectors), dtype=bool)  # per call: a served model embeds on several threads
        present[flat] = True
        rows = np.flatnonzero(present)
        slots = np.empty(len(vectors), dtype=np.intp)  # only the batch's rows are read
        slots[rows] = np.arange(len(rows))
        slot = slots[flat]
        counts = np.bincount(text * len(rows) + slot, minlength=n * len(rows)).reshape(n, len(rows))
        lengths = counts.sum(axis=1)
        sums = counts.astype(np.float32) @ vectors[rows].astype(np.float32)
        nonempty = lengths > 0
        out[nonempty] = sums[nonempty] / lengths[nonempty, None]
        return out

    def embed_query(self, text: str, deadline: float | None = None) -> np.ndarray | Sequence[float]:
        """In-process and sub-millisecond: nothing to bound, the caller checks the deadline after.

        Without numpy loaded, `static_query` computes the same float32 vector without it when it can
        (None: text it does not tokenize, or a sum whose float32 rounding would depend on BLAS's order).
        """
        if "numpy" not in sys.modules:
            if self._query_model is None:
                from .static_query import StaticQueryModel

                self._query_model = StaticQueryModel(self.model_dir)
            vector = self._query_model.query_vector(split_identifiers(text))
            if vector is not None:
                return vector
        return self.embed_documents([text])[0]
