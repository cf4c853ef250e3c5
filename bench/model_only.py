"""`python -m bench.model_only MODEL_DIR …`: file-level NDCG@10 of the embedding model alone, per set and split.

Why: the product's ranking adds BM25, paths, definitions and file support, and was tuned with the
model it shipped with, so a better model can hide behind it on the sets that ranking was tuned on.
Ranking every chunk of a corpus by cosine alone measures the model itself: what a retrained model
must improve before its product figures (`python -m bench.languages --model …`) are worth reading.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from .languages import LANGUAGES, REFERENCE, fetch, model_dir, split_of


def _chunks(root: Path) -> tuple[list[str], list[str]]:
    from moonmind_worker.indexing.points import embedding_text
    from moonmind_worker.text.chunking import chunk_text
    from moonmind_worker.text.files import read_text, walk

    texts, files = [], []
    for rel, full in walk(root):
        text, _ = read_text(full, 1_000_000)
        for chunk in chunk_text(text, rel) if text else []:
            texts.append(embedding_text(rel, chunk))
            files.append(rel)
    return texts, files


def main(argv: list[str] | None = None) -> int:
    import tempfile

    import numpy as np

    from moonmind_worker.embedding.static import StaticEmbedder
    from moonmind_worker.retrieval.evaluation import load_queries, run_eval

    ap = argparse.ArgumentParser(prog="python -m bench.model_only", description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", help="static model directories, or git:REV for the shipped one at a commit")
    ap.add_argument("--split", choices=("dev", "test", "all"), default="dev")
    args = ap.parse_args(argv)
    corpora = [c for c in LANGUAGES + REFERENCE if c.queries.is_file() and args.split in ("all", split_of(c))]
    scores: dict[str, dict[str, float]] = {m: {} for m in args.models}
    with tempfile.TemporaryDirectory(prefix="moonmind-model-") as tmp:
        embedders = {m: StaticEmbedder(model_dir(m, Path(tmp))) for m in args.models}
        for c in corpora:
            texts, files = _chunks(fetch(c))
            queries = load_queries(c.queries)
            for m, emb in embedders.items():
                vectors = emb.embed_documents(texts)

                def search(q, emb=emb, vectors=vectors) -> list[str]:
                    order = np.argsort(-(vectors @ np.asarray(emb.embed_documents([q.query])[0])), kind="stable")
                    out: list[str] = []
                    for i in order:
                        if files[i] not in out:
                            out.append(files[i])
                            if len(out) == 10:
                                break
                    return out

                scores[m][c.repo] = run_eval(queries, search, k=10, top_k=10).ndcg
    print("| project | split | " + " | ".join(args.models) + " |")
    print("|---|---|" + "---|" * len(args.models))
    for c in corpora:
        print(f"| {c.repo} | {split_of(c)} | " + " | ".join(f"{scores[m][c.repo]:.3f}" for m in args.models) + " |")
    print("| **mean** | | " + " | ".join(f"**{statistics.fmean(scores[m].values()):.3f}**" for m in args.models) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
