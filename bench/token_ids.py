"""The static model's cached token ids against `tokenizers` itself, on every chunk a real index run embeds.

`python -m bench.token_ids [DIR ...]` chunks each tree as `rag index` does (default: the Django 5.1.4
source, this repository's tree and every `bench.languages` corpus) and checks that
`embedding.token_cache.TokenIdCache` gives, for every chunk's embedding text, exactly the ids
`Tokenizer.encode_batch_fast` gives (after `split_identifiers`, truncated to 512), in the batches
the indexer embeds. Exit 1 and name the first difference otherwise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def texts_of(root: Path) -> list[str]:
    """Every chunk's embedding text, as `points.build` embeds it."""
    from moonmind_worker.indexing.points import embedding_text
    from moonmind_worker.settings import get_settings
    from moonmind_worker.text.chunking import chunk_text
    from moonmind_worker.text.files import read_text, walk

    settings = get_settings()
    out = []
    for rel, path in walk(root, []):
        text, _ = read_text(path, settings.max_file_bytes)
        if text is not None:
            out.extend(embedding_text(rel, c) for c in chunk_text(text, rel, settings.chunk_chars, settings.chunk_overlap_lines))
    return out


def check(texts: list[str], batch: int = 256) -> tuple[int, str | None]:
    """(texts checked, the first text whose ids differ or None), one fresh cache per tree."""
    import numpy as np

    from moonmind_worker.embedding import StaticEmbedder, split_identifiers
    from moonmind_worker.embedding.token_cache import TokenIdCache

    tokenizer = StaticEmbedder()._tokenizer
    cache = TokenIdCache(tokenizer, 512)
    for i in range(0, len(texts), batch):
        part = texts[i : i + batch]
        want = [e.ids for e in tokenizer.encode_batch_fast([split_identifiers(t) for t in part], add_special_tokens=False)]
        for text, got, ids in zip(part, cache.encode(part), want):
            if np.frombuffer(got, dtype="<u4").tolist() != ids:
                return i, text
    return len(texts), None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("roots", nargs="*", help="trees to check (default: Django, this repository, the language corpora)")
    args = ap.parse_args()
    if args.roots:
        roots = [Path(r) for r in args.roots]
    else:
        from .languages import LANGUAGES, REFERENCE, fetch
        from .owner import django_source

        roots = [django_source(), Path(__file__).resolve().parent.parent, *(fetch(c) for c in LANGUAGES + REFERENCE)]
    failed = 0
    for root in roots:
        n, bad = check(texts_of(root))
        print(f"{root}: {n} chunks, {'identical' if bad is None else 'DIFFERENT'}")
        if bad is not None:
            print(f"  first difference: {bad[:300]!r}")
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
