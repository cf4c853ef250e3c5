"""What a hosted provider preset knows about its models without asking them.

Cohere serves an OpenAI-compatible embeddings endpoint (`/compatibility/v1/embeddings`), so
`MOONMIND_EMBEDDING_PROVIDER=cohere` is the OpenAI adapter pointed there with COHERE_API_KEY. Its
models' sizes are published, so no dimension probe (one billed request) is needed to create a
collection; a model not listed here is probed as any other.
"""

from __future__ import annotations

#: Output size of Cohere's embedding models (docs.cohere.com, "Models"), at their default dimension.
COHERE_DIMENSIONS: dict[str, int] = {
    "embed-multilingual-v3.0": 1024,
    "embed-english-v3.0": 1024,
    "embed-multilingual-light-v3.0": 384,
    "embed-english-light-v3.0": 384,
    "embed-v4.0": 1536,
}


def known_dimensions(provider: str, model: str, requested: int | None) -> int | None:
    """The model's output size when the preset knows it and no other size was asked for (else None: probe it)."""
    if provider == "cohere" and requested is None:
        return COHERE_DIMENSIONS.get(model)
    return None
