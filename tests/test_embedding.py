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
