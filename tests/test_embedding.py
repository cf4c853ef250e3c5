"""The offline static embedder: what it does to code before the model sees it."""

from __future__ import annotations

import numpy as np

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
