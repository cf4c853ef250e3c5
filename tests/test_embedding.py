"""The offline static embedder: what it does to code before the model sees it."""

from __future__ import annotations

import numpy as np
import pytest

from moonmind_worker.embedding import StaticEmbedder, split_identifiers


def test_camel_case_identifiers_embed_like_the_words_of_a_question():
    e = StaticEmbedder()
    code, words, other = e.embed_documents(["getStreamChunkSize", "get stream chunk size", "parse the config file"])
    assert float(np.dot(code, words)) > 0.99
    assert float(np.dot(code, other)) < 0.9
    assert split_identifiers("HTTPServer.readAll parse_error") == "HTTP Server.read All parse_error"


def _texts() -> list[str]:
    """Lines of this package's own source, questions, and random ASCII (controls and punctuation included)."""
    import random
    from pathlib import Path

    import moonmind_worker

    lines = [line for f in sorted(Path(moonmind_worker.__file__).parent.glob("*.py"))[:12]
             for line in f.read_text().splitlines() if line.strip()]
    rng = random.Random(20)
    noise = ["".join(chr(rng.randrange(128)) for _ in range(rng.randint(1, 40))) for _ in range(400)]
    questions = ["how are query strings parsed", "where is the csrf token checked", "getStreamChunkSize", "HTTPServer",
                 "x" * 101, "a  b\t\tc\r\nd", "snake_case_name(arg=1)", "[PAD] and [UNK]", "naïve café", "翻訳"]
    return questions + lines[:1500] + noise


@pytest.mark.slow
def test_the_numpy_free_query_vector_is_bit_for_bit_the_numpy_one():
    from moonmind_worker.embedding import STATIC_MODEL_DIR
    from moonmind_worker.embedding.static_query import StaticQueryModel

    e, model = StaticEmbedder(), StaticQueryModel(STATIC_MODEL_DIR)
    texts = _texts()
    used = 0
    for text in texts:
        vector = model.query_vector(split_identifiers(text))
        if vector is None:
            continue
        used += 1
        assert np.asarray(vector, dtype=np.float32).tobytes() == e.embed_documents([text])[0].tobytes(), text
    assert used > len(texts) // 4  # measured: about 3 in 10 of these (long code lines fall back more than questions)


def test_the_numpy_free_tokenizer_gives_the_model_tokenizers_ids_or_declines():
    from moonmind_worker.embedding import STATIC_MODEL_DIR
    from moonmind_worker.embedding.static_query import StaticQueryModel

    e, model = StaticEmbedder(), StaticQueryModel(STATIC_MODEL_DIR)
    for text in _texts():
        ids = model.token_ids(split_identifiers(text))
        if ids is not None:
            assert ids == e._tokenizer.encode(split_identifiers(text), add_special_tokens=False).ids, text
    for declined in ("naïve café", "翻訳", "keep [UNK] literal", "[PAD]"):
        assert model.token_ids(declined) is None


def _tricky_texts() -> list[str]:
    """What a repository holds besides plain code: every kind of text the normalizer treats specially."""
    import random

    rng = random.Random(7)
    alphabet = [*map(chr, range(0, 0x250)), *"\u0301\u0308\u00a0\u1680\u2000\u2009\u200b\u2028\u2029\u202f\u205f\u3000\ufeff\ufffd",
                *"翻訳中文字符한국어日本語ﾊﾝｶｸ𝔘𝔫𝔦𝔠𝔬𝔡𝔢🙂👍🏽", *"«»¿¡—–…‘’“”•§¶†‡", *"İıßẞΣσςǅǆﬁﬀ"]
    noise = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 300))) for _ in range(300)]
    words = ["getStreamChunkSize", "HTTPServer", "parse_error", "x1y2Z3", "42", "3.14e-10", "0xFFu", "==>", "!!!???",
             "naïve", "café", "Ærøskøbing", "ΣΊΣΥΦΟΣ", "İstanbul", "straße", "日本語のテキスト", "[PAD]", "a[UNK]b", "[unk]",
             "x" * 101, "é" * 120, "\x00", "a\x0bb", "a\x1cb", "a\x85b", "a\xa0b", "a\u3000b", "tab\there", "cr\rlf\n"]
    mixed = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 60))) for _ in range(200)]
    long = [" ".join(rng.choice(words) for _ in range(900)), "=" * 3000, "a." * 700, "翻" * 800,
            "def getValue(self):\n    return self._cache[key]\n" * 40]
    return [*_texts(), *noise, *mixed, *long, "", " ", "\n\t\r "]


def test_cached_token_ids_are_the_tokenizers_own_on_any_text():
    from moonmind_worker.embedding.token_cache import TokenIdCache

    tokenizer = StaticEmbedder()._tokenizer
    texts = _tricky_texts()
    want = [e.ids for e in tokenizer.encode_batch_fast([split_identifiers(t) for t in texts], add_special_tokens=False)]
    assert max(map(len, want)) == 512  # some texts are truncated
    for cache in (TokenIdCache(tokenizer, 512), TokenIdCache(tokenizer, 512, max_cached=50)):  # bounded: emptied often
        for _ in range(2):  # cold, then warm
            for i in range(0, len(texts), 97):
                got = cache.encode(texts[i : i + 97])
                for text, ids, expected in zip(texts[i : i + 97], got, want[i : i + 97]):
                    assert np.frombuffer(ids, dtype="<u4").tolist() == expected, repr(text)


def test_the_written_out_odd_spaces_are_every_character_this_python_splits_on_besides_the_four():
    from moonmind_worker.embedding.token_cache import ODD_SPACES

    every = "".join(c for c in map(chr, range(0x110000)) if c.isspace() and c not in " \t\n\r")
    assert ODD_SPACES == every


def test_a_one_shot_search_process_does_not_import_the_token_cache():
    """Its module is the indexer's (documents); a query embeds through static_query without it."""
    import subprocess
    import sys

    code = (
        "import sys; from moonmind_worker.embedding.static import StaticEmbedder; "
        "StaticEmbedder().embed_query('where are tokens cached'); "
        "print('moonmind_worker.embedding.token_cache' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


@pytest.mark.slow
def test_document_vectors_are_bit_for_bit_those_of_the_tokenizer_and_a_sorted_unique():
    """The cached ids and the vocabulary table give the vectors `np.unique` over `tokenizers`' ids gave."""
    e = StaticEmbedder()
    texts = _tricky_texts()
    encodings = e._tokenizer.encode_batch_fast([split_identifiers(t) for t in texts], add_special_tokens=False)
    rows_out = []
    for i in range(0, len(texts), 256):
        ids = [np.asarray(enc.ids, dtype=np.int64) for enc in encodings[i : i + 256]]
        n = len(ids)
        flat = np.concatenate(ids)
        text = np.repeat(np.arange(n), [len(a) for a in ids])
        known = flat != e._unk
        flat, text = flat[known], text[known]
        rows, slot = np.unique(flat, return_inverse=True)
        counts = np.bincount(text * len(rows) + slot, minlength=n * len(rows)).reshape(n, len(rows))
        lengths = counts.sum(axis=1)
        sums = counts.astype(np.float32) @ e._vectors[rows].astype(np.float32)
        out = np.zeros((n, e.dimensions), dtype=np.float32)
        out[lengths > 0] = sums[lengths > 0] / lengths[lengths > 0, None]
        rows_out.append(out)
    norms = np.linalg.norm(np.vstack(rows_out), axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    assert (np.vstack(rows_out) / norms).astype(np.float32).tobytes() == e.embed_documents(texts).tobytes()


@pytest.mark.slow
def test_threads_embedding_at_once_get_the_vectors_one_thread_gets():
    """A served model embeds on several threads: the shared token caches must not mix their batches."""
    from concurrent.futures import ThreadPoolExecutor

    texts = _tricky_texts()
    parts = [texts[i::4] for i in range(4)]
    want = [StaticEmbedder().embed_documents(p).tobytes() for p in parts]
    shared = StaticEmbedder()
    with ThreadPoolExecutor(4) as pool:
        for _ in range(3):
            assert list(pool.map(lambda p: shared.embed_documents(p).tobytes(), parts)) == want
