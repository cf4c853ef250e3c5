"""Identifier-aware BM25 terms for Qdrant sparse vectors.

Why: code search lives on identifiers. `OAuth2PasswordBearer` must match a query
for "oauth2 password bearer" and for itself; `field_validator` must match
"field validator". Each identifier yields its whole form and its parts. The
document side carries BM25 term-frequency weights; the query side carries each
term's inverse document frequency over the repositories searched (`idf`), so the
sparse score is BM25 whose statistics are the scope's own, never the collection's.
(Collections made before that keep Qdrant's IDF modifier and weigh query terms 1.)
"""

from __future__ import annotations

import math
import re
import zlib
from collections import Counter
from functools import lru_cache
from itertools import chain

_TOKEN = re.compile(r"[A-Za-z0-9_]+")
_CAMEL = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")

#: Words so common in English and code that they only add noise.
STOPWORDS = frozenset(
    """a an and are as at be but by for from has have how i if in into is it its of on or so such that the their
    then there these this to was what when where which who why will with does do can self none true false return
    def class import none use used using""".split()
)

K1 = 1.2
B = 0.75
AVG_LEN = 120.0


def _stem(word: str) -> str:
    """A light suffix stripper that sends a word's forms to one term.

    routes/route, values/value, types/type, matches/match, processes/process,
    dependencies/dependency: a plural `-es` is stripped only after s, x, z, ch or sh
    (elsewhere the `e` belongs to the word: `routes` is route + s, which the old rule
    cut to `rout` while `route` stayed `route`), and a final `s` is kept after ss, us,
    is (`process`, `status`, `analysis` are not plurals). Left as it was: `-ing`/`-ed`
    (routing -> rout, parsed -> pars; dropping a silent `e` to join them cost attrs).
    """
    if len(word) <= 4:
        return word
    if word.endswith("ies") and len(word) >= 6:
        return word[:-3] + "y"
    if word.endswith("ing") and len(word) >= 6:
        return word[:-3]
    if word.endswith("ed"):
        return word[:-2]
    if word.endswith("es") and (word[-3] in "sxz" or word[-4:-2] in ("ch", "sh")):
        return word[:-2]
    if word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def terms(text: str) -> list[str]:
    """Identifier-aware terms: whole identifiers lowercased plus their camel/snake parts, stemmed."""
    out: list[str] = []
    for tok in _TOKEN.findall(text):
        out.extend(_token_terms(tok))
    return out


@lru_cache(maxsize=1 << 17)
def _token_terms(tok: str) -> tuple[str, ...]:
    """The terms of one token. Cached: code repeats its identifiers, and uncached this is most of indexing time."""
    out: list[str] = []
    low = tok.lower()
    parts = [p.lower() for piece in tok.split("_") for p in _CAMEL.findall(piece)]
    if len(parts) > 1 or (parts and parts[0] != low.strip("_")):
        if len(low) > 1 and low not in STOPWORDS:
            out.append(low)
        out.extend(_stem(p) for p in parts if len(p) > 1 and p not in STOPWORDS)
    elif len(low) > 1 and low not in STOPWORDS:
        out.append(_stem(low))
    return tuple(out)


class _TermIds(dict):
    """token -> the ids of its terms. A dict, not `lru_cache`: a hit is the dict's own lookup, in C, with no
    wrapper call; emptied when full, so it stays bounded."""

    def __missing__(self, tok: str) -> tuple[int, ...]:
        if len(self) >= 1 << 17:
            self.clear()
        # the uncached terms: this dict is the document side's cache, and filling `_token_terms`' cache
        # too kept a second copy of every token (up to 2**17 entries) that an index run never reads
        ids = self[tok] = tuple(term_id(t) for t in _token_terms.__wrapped__(tok))
        return ids


_token_ids = _TermIds().__getitem__


def term_id(term: str) -> int:
    """A stable 31-bit id per term (same on every machine and Python version)."""
    return zlib.crc32(term.encode("utf-8")) & 0x7FFFFFFF


def document_vector(text: str) -> tuple[list[int], list[float]]:
    """BM25 term-frequency weights (the IDF part is the query's: `idf`)."""
    counts = Counter(chain.from_iterable(map(_token_ids, _TOKEN.findall(text))))  # counted in C, no generator frames
    length = sum(counts.values()) or 1
    norm = K1 * (1 - B + B * length / AVG_LEN)
    ids = sorted(counts)
    k1 = K1 + 1
    tf = list(map(counts.__getitem__, ids))
    weight = {c: c * k1 / (c + norm) for c in set(tf)}  # a text's counts take few values: each computed once
    return ids, list(map(weight.__getitem__, tf))


def idf(docs: int, df: int) -> float:
    """BM25's inverse document frequency, the formula of Qdrant's IDF modifier, over `docs` documents."""
    return math.log(1.0 + (docs - df + 0.5) / (df + 0.5))


def query_vector(text: str) -> tuple[list[int], list[float]]:
    """Each distinct query term weighs 1; an empty query term set yields no vector."""
    ids = sorted({term_id(t) for t in terms(text)})
    return ids, [1.0] * len(ids)
