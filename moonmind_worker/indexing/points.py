"""Chunks to points: ids, embedding texts, payloads and vectors, without pydantic.

Why a module of its own: the index worker processes build points and import this, the embedder and
the chunker only; pydantic (the contracts) would add its memory to each of them, the run's memory beside
the writer's. The payload contract still decides every payload: the caller validates one
`ChunkPayload` per batch (`payloads.payload_template`) and each point's payload is a copy of its
dump with the chunk's own fields set.
"""

from __future__ import annotations

import re
import uuid
from array import array
from typing import Any

from ..store.base import PointIn, SparseVec
from ..text import lexical
from ..text.chunking import Chunk, language_of

_NAMESPACE = uuid.UUID("6f1d0b52-3c0a-4f0e-9d7e-6d6f6f6e6d69")

#: One batch of files' chunks: (path, content hash of the file, its chunks).
Docs = list[tuple[str, str, list[Chunk]]]


def point_id(tenant: str, repo: str, path: str, sequence: int, trust_class: str, run_id: str = "") -> str:
    """Deterministic id: the same chunk slot always maps to the same point."""
    return str(uuid.uuid5(_NAMESPACE, f"{tenant}\0{repo}\0{trust_class}\0{run_id}\0{path}\0{sequence}"))


def titled_text(path: str, section_title: str, text: str) -> str:
    """`embedding_text` from a stored payload's fields (a re-embed must see exactly what the indexer embedded)."""
    title = f"{section_title}\n" if section_title else ""
    return f"{path}\n{title}{text}"


def embedding_text(path: str, chunk: Chunk) -> str:
    """What the models see: the path and enclosing symbol give a chunk its context."""
    return titled_text(path, chunk.section_title, chunk.text)


def chunk_fields(path: str, fhash: str, c: Chunk, language: str) -> dict:
    """The payload fields that differ from chunk to chunk (`build` copies the rest from the template)."""
    return {
        "path": path,
        "language": language,
        "chunk_id": f"{path}#{c.chunk_sequence}",
        "chunk_hash": c.chunk_hash,
        "content_hash": fhash,
        "offset_start": c.offset_start,
        "offset_end": c.offset_end,
        "line_start": c.line_start,
        "line_end": c.line_end,
        "section_title": c.section_title,
        "chunk_sequence": c.chunk_sequence,
        "total_chunks": c.total_chunks,
        "text": c.text,
        "token_count": c.token_count,
        "symbols": symbol_keys(c.definitions),
        "definitions": [{"name": d.name, "kind": d.kind, "line_start": d.start, "line_end": d.end, "signature": d.signature}
                        for d in c.definitions],
    }


def symbol_keys(definitions: Any) -> list[str]:
    """The lookup keys of a chunk's definitions: each name lower-cased, qualified (`router.handle`) and short (`handle`).

    Why both: an agent asks for `handle` or for `Router.handle`; one exact keyword match on an
    indexed field finds either, with no scan of chunk text. Lower case: `rag symbols` ignores case.
    """
    keys: set[str] = set()
    for d in definitions:
        for name in d.name.split(", "):  # `res.type, res.contentType = fn` defines both
            name = name.strip().lower()
            if name:
                keys.add(name)
                keys.add(re.split(r"\.|::", name)[-1])
    return sorted(keys)


def build(embedder: Any, docs: Docs, template: dict[str, Any]) -> list[PointIn]:
    """Embed the chunks of several files as one batch and wrap them as points.

    `template` is a validated payload of this batch (`payloads.payload_template`): its batch-wide
    values (repo, tenant, trust class, run, model, time) are every point's, and so is its key order.
    """
    flat = [(path, h, c) for path, h, chunks in docs for c in chunks]
    if not flat:
        return []
    texts = [embedding_text(path, c) for path, _, c in flat]
    # float32 rows as array('f'): what the stores read (.tolist(), the same numbers), and what crosses
    # from a worker process to the writer without numpy there (numpy's memory, the run long)
    import numpy as np

    vectors = np.ascontiguousarray(embedder.embed_documents(texts), dtype=np.float32)
    tenant, repo, trust_class, run_id = template["tenant"], template["repo"], template["trust_class"], template["run_id"]
    languages: dict[str, str] = {}
    points = []
    for (path, fhash, c), text, vec in zip(flat, texts, vectors):
        language = languages.get(path) or languages.setdefault(path, language_of(path))
        payload = template.copy()
        payload.update(chunk_fields(path, fhash, c, language))
        ids, values = lexical.document_vector(text)
        points.append(
            PointIn(
                id=point_id(tenant, repo, path, c.chunk_sequence, trust_class, run_id),
                dense=array("f", vec.tobytes()),
                sparse=SparseVec(ids, values),
                payload=payload,
            )
        )
    return points
