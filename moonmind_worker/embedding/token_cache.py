"""The static model's document token ids, from caches of the words code repeats: the ids `tokenizers` gives, faster.

Why: the tokenizer is the largest cost of indexing a chunk without them, and code says
the same few thousand words over and over. BERT's pipeline (BertNormalizer, BertPreTokenizer, WordPiece,
truncation to the first 512 ids) never joins anything across a space, tab, newline or carriage
return, and neither does `split_identifiers` (its patterns match letters and digits only), so a
text's ids are the concatenation of the ids of its whitespace-separated tokens, each encoded alone.
Two caches make that cheap:

* token -> ids, for a whole whitespace-separated token as it stands in the text (`self.assertEqual(`);
* word -> ids, for a word of a printable-ASCII token (without the added tokens [PAD], [UNK]) after
  `split_identifiers`, lowercasing and BertPreTokenizer's split (every ASCII punctuation character a
  word of its own): what WordPiece sees.

Words, and tokens that are not printable ASCII (accents, CJK, control characters: what the
normalizer changes), are encoded by the real tokenizer, so every id comes from `tokenizers` itself.
Ids are kept as little-endian uint32 bytes, so a text's ids are one `bytes.join`.
"""

from __future__ import annotations

import re
import threading
from itertools import chain
from typing import Any

from .base import split_identifiers
from .static_query import _PUNCTUATION

#: Characters `str.split()` splits on that BertNormalizer does not make a separator (it drops the
#: controls among them, so `a\x0bb` is one word): a text holding any is split on the four it does.
#: Written out, not computed: testing `str.isspace` on every code point is slow at import, on the
#: one-shot search path; tests/test_embedding.py checks this list is exactly what this Python splits on.
ODD_SPACES = (
    "\x0b\x0c\x1c\x1d\x1e\x1f\x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009"
    "\u200a\u2028\u2029\u202f\u205f\u3000"
)
_ODD_SPACE = re.compile("[" + re.escape(ODD_SPACES) + "]")
_TOKEN = re.compile(r"[^ \t\n\r]+")
#: BertPreTokenizer on lowercased printable ASCII without spaces (letter/digit runs, and each punctuation
#: character), and the newline `_learn` puts between tokens.
_WORD_OR_BREAK = re.compile("\n|[a-z0-9]+|[" + re.escape("".join(sorted(_PUNCTUATION))) + "]")
_ID_BYTES = 4  # uint32 little-endian
#: The ids of the newline between tokens in `_learn`: id 2**32 - 1. Ids below 2**24 end in a zero byte,
#: so these four bytes never occur in a run of them but at this id's place.
_BREAK = b"\xff" * _ID_BYTES


class TokenIdCache:
    """Token ids per text, as uint32 bytes, identical to `tokenizer.encode_batch_fast(...)`'s `ids` (truncated).

    `tokenizer` is the model's `tokenizers.Tokenizer`, set up as `StaticEmbedder` sets it up (no
    padding, truncation to `max_tokens`). Each cache is emptied when it outgrows its bound, so a
    process's memory stays flat however large the repository.
    """

    def __init__(self, tokenizer: Any, max_tokens: int = 512, max_cached: int = 1 << 15) -> None:
        self._tokenizer = tokenizer
        self._max_bytes = max_tokens * _ID_BYTES
        self._max_cached = max_cached
        self._tokens: dict[str, bytes] = {}
        self._words: dict[str, bytes] = {"\n": _BREAK}
        self._lock = threading.Lock()
        if tokenizer.get_vocab_size() >= 1 << 24:
            raise ValueError("token ids must be below 2**24 (see _BREAK)")

    def encode(self, texts: list[str]) -> list[bytes]:
        """The token ids of each text (before `split_identifiers`: it is applied here), truncated.

        Locked: a served model embeds on several threads, and one emptying a cache between another's
        learning and its lookups would fail that one.
        """
        split = [_TOKEN.findall(t) if _ODD_SPACE.search(t) else t.split() for t in texts]
        with self._lock:
            if len(self._tokens) > self._max_cached:
                self._tokens.clear()
            missing = set(chain.from_iterable(split)).difference(self._tokens)
            if missing:
                self._learn(missing)
            get, limit = self._tokens.__getitem__, self._max_bytes
            return [b"".join(map(get, tokens))[:limit] for tokens in split]

    def _learn(self, tokens: set[str]) -> None:
        """Cache the ids of tokens not seen yet: printable ASCII through the word cache, the rest encoded whole.

        The printable-ASCII ones go through as one text (a newline between tokens: nothing joins across
        it), so splitting, lowercasing and the word lookups are a few calls, not a few per token.
        """
        plain, other = [], []
        for token in tokens:
            if token.isascii() and token.isprintable() and "[PAD]" not in token and "[UNK]" not in token:
                plain.append(token)
            else:
                other.append(token)
        for token, ids in zip(other, self._ids([split_identifiers(t) for t in other])):
            self._tokens[token] = ids
        if not plain:
            return
        words = self._words
        if len(words) > self._max_cached:
            words.clear()
            words["\n"] = _BREAK
        found = _WORD_OR_BREAK.findall(split_identifiers("\n".join(plain)).lower())
        new_words = list(set(found).difference(words))
        for word, ids in zip(new_words, self._ids(new_words)):
            words[word] = ids
        self._tokens.update(zip(plain, b"".join(map(words.__getitem__, found)).split(_BREAK)))

    def _ids(self, texts: list[str]) -> list[bytes]:
        import numpy as np

        if not texts:
            return []
        encodings = self._tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        return [np.asarray(e.ids, dtype="<u4").tobytes() for e in encodings]
