"""The static model's query vector without numpy or tokenizers, bit for bit what `StaticEmbedder` computes.

Why: a one-shot `rag search` embeds one short query, and importing numpy, tokenizers and
safetensors to do it cost more than everything else the query needs. Here the float16 rows
are read from the memory-mapped safetensors file, the tokenizer is the model's own WordPiece
vocabulary applied as `tokenizers` applies it (BertNormalizer + BertPreTokenizer +
WordPiece), and every float32 operation is reproduced exactly:

* the sum of the query's token rows: numpy leaves its order to BLAS, so the sum is used only
  when every partial sum, in any order, is exact in float32 (then any order gives the same
  bits); otherwise `query_vector` returns None and the caller embeds with numpy;
* the mean (numpy divides float32 by int64 in float64, then stores float32), the norm
  (numpy's pairwise float32 sum of the squares) and the division by it: one float32 rounding
  each, which float64 arithmetic followed by rounding to float32 reproduces (53 >= 2 x 24 + 2 bits).

Only text `tokenizers` would normalise trivially is handled: ASCII, without the added tokens
([PAD], [UNK]) it matches before normalising; anything else returns None as well.
"""

from __future__ import annotations

import json
import math
import mmap
import struct
from array import array
from pathlib import Path

_F32 = struct.Struct("<f")
#: ASCII characters BertNormalizer's clean_text drops (controls other than tab, newline, return).
_DROPPED = "".join(chr(c) for c in [*range(0, 9), 11, 12, *range(14, 32), 127])
#: ... and the ones it turns into a space before the pre-tokenizer splits on it.
_SPACES = "\t\n\r"
#: Rust's char::is_ascii_punctuation: BertPreTokenizer makes each one a word of its own.
_PUNCTUATION = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
_NORMALIZE = str.maketrans({**{c: None for c in _DROPPED}, **{c: " " for c in _SPACES}})
_ADDED_TOKENS = ("[PAD]", "[UNK]")
#: numpy's pairwise summation block (PW_BLOCKSIZE in numpy/_core/src/umath/loops_utils.h.src).
_PW_BLOCK = 128
_TWO_24 = float(1 << 24)


def f32(x: float) -> float:
    """`x` rounded to the nearest float32 (as a Python float)."""
    return _F32.unpack(_F32.pack(x))[0]


class StaticQueryModel:
    """The static model's vocabulary and float16 rows, memory-mapped: nothing is read until a query needs it."""

    def __init__(self, model_dir: Path) -> None:
        tokenizer = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
        model = tokenizer["model"]
        self._wordpiece_ok = (
            model.get("type") == "WordPiece" and model.get("continuing_subword_prefix") == "##"
            and tokenizer.get("normalizer") == {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                                                "strip_accents": None, "lowercase": True}
            and tokenizer.get("pre_tokenizer") == {"type": "BertPreTokenizer"}
            and [t["content"] for t in tokenizer.get("added_tokens", [])] == list(_ADDED_TOKENS)
        )
        self.vocab: dict[str, int] = model["vocab"]
        self.unk = self.vocab[model["unk_token"]]
        self.max_word_chars = int(model.get("max_input_chars_per_word", 100))
        with open(model_dir / "embeddings.safetensors", "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        (header_len,) = struct.unpack_from("<Q", self._map, 0)
        header = json.loads(self._map[8 : 8 + header_len])["embeddings"]
        self.rows, self.dimensions = header["shape"]
        self._data = 8 + header_len + header["data_offsets"][0]
        self._row = struct.Struct(f"<{self.dimensions}e")
        self._ok = self._wordpiece_ok and header["dtype"] == "F16"

    # -- tokenizer (what `tokenizers` does for this model's config, ASCII only) -------------
    def token_ids(self, text: str, max_tokens: int = 512) -> list[int] | None:
        """The ids `Tokenizer.encode(text, add_special_tokens=False).ids` gives (truncated), or None when not sure."""
        if not self._ok or not text.isascii() or any(t in text for t in _ADDED_TOKENS):
            return None
        ids: list[int] = []
        for chunk in text.translate(_NORMALIZE).lower().split(" "):
            for word in _split_punctuation(chunk):
                ids.extend(self._wordpiece(word))
        return ids[:max_tokens]

    def _wordpiece(self, word: str) -> list[int]:
        if len(word) > self.max_word_chars:
            return [self.unk]
        out, start, vocab = [], 0, self.vocab
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in vocab:
                    out.append(vocab[piece])
                    break
                end -= 1
            else:
                return [self.unk]
            start = end
        return out

    # -- the vector ---------------------------------------------------------------------
    def row(self, token: int) -> tuple[float, ...]:
        return self._row.unpack_from(self._map, self._data + token * self._row.size)

    def query_vector(self, text: str) -> array | None:
        """The unit float32 query vector of already identifier-split `text`, or None (then use numpy)."""
        ids = self.token_ids(text)
        if ids is None:
            return None
        counts: dict[int, int] = {}
        for i in ids:
            if i != self.unk:
                counts[i] = counts.get(i, 0) + 1
        if any(i >= self.rows for i in counts):
            return None
        length = sum(counts.values())
        dims = self.dimensions
        if not length:
            return array("f", bytes(4 * dims))
        sums = [0.0] * dims
        bound = [0.0] * dims  # sum of |terms| per dimension
        grain = [0] * dims  # OR of the terms as integers in units of 2**-24: its lowest set bit divides them all
        for token, count in counts.items():
            for d, v in enumerate(self.row(token)):
                term = count * v
                sums[d] += term
                bound[d] += abs(term)
                grain[d] |= int(abs(term) * _TWO_24)
        for d in range(dims):
            g = grain[d] & -grain[d]
            if g and bound[d] * _TWO_24 >= (1 << 24) * g:
                return None  # some partial sum may round in float32: its value depends on BLAS's order
        mean = [f32(s / length) for s in sums]
        squares = [f32(m * m) for m in mean]
        norm = f32(math.sqrt(_pairwise_sum(squares, 0, dims)))
        if norm == 0.0:
            norm = 1.0
        return array("f", [m / norm for m in mean])


def _split_punctuation(chunk: str) -> list[str]:
    """BertPreTokenizer on a space-free ASCII run: every punctuation character is a word of its own."""
    if not chunk:
        return []
    words: list[str] = []
    current: list[str] = []
    for c in chunk:
        if c in _PUNCTUATION:
            if current:
                words.append("".join(current))
                current = []
            words.append(c)
        else:
            current.append(c)
    if current:
        words.append("".join(current))
    return words


def _pairwise_sum(a: list[float], start: int, n: int) -> float:
    """numpy's float32 add.reduce of a[start:start+n] (pairwise, 8 accumulators), each step rounded to float32."""
    if n < 8:
        res = -0.0
        for i in range(start, start + n):
            res = f32(res + a[i])
        return res
    if n <= _PW_BLOCK:
        r = a[start : start + 8]
        i = 8
        while i < n - (n % 8):
            for j in range(8):
                r[j] = f32(r[j] + a[start + i + j])
            i += 8
        res = f32(f32(f32(r[0] + r[1]) + f32(r[2] + r[3])) + f32(f32(r[4] + r[5]) + f32(r[6] + r[7])))
        while i < n:
            res = f32(res + a[start + i])
            i += 1
        return res
    n2 = n // 2
    n2 -= n2 % 8
    return f32(_pairwise_sum(a, start, n2) + _pairwise_sum(a, start + n2, n - n2))
