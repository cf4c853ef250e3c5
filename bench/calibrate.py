"""`python -m bench.calibrate [--model DIR]`: where the static model's default score threshold stands.

Why: `rag search` drops items below a per-model threshold (retrieval/pipeline.py THRESHOLDS). It
must sit below every query's best relevant item and above a nonsense query, and a retrained model
moves scores: this prints both sides on shared/eval/fastapi.json and a nonsense query.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from .languages import REFERENCE, fetch, model_dir


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.calibrate", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="static model directory or git:REV (default: the shipped one)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="moonmind-calibrate-") as tmp:
        os.environ["MOONMIND_HOME"] = str(Path(tmp) / "home")
        os.environ["MOONMIND_TENANT"] = "bench"
        from moonmind_worker import runtime
        from moonmind_worker.contracts import parse_query
        from moonmind_worker.embedding.static import StaticEmbedder
        from moonmind_worker.indexing.indexer import index_repository
        from moonmind_worker.retrieval.evaluation import load_queries
        from moonmind_worker.retrieval.pipeline import THRESHOLDS, retrieve_context_pack
        from moonmind_worker.settings import get_settings

        get_settings.cache_clear()
        settings = get_settings()
        embedder = (runtime.get_embedder(settings) if args.model is None
                    else StaticEmbedder(model_dir(args.model, Path(tmp)), name=settings.model_name))
        store = runtime.get_store(settings)
        corpus = next(c for c in REFERENCE if c.repo == "fastapi")
        try:
            index_repository(fetch(corpus), repo="fastapi", tenant="bench", settings=settings, embedder=embedder,
                             store=store)

            def scores(query: str) -> list[tuple[str, float]]:
                pack = retrieve_context_pack(parse_query({"query": query, "top_k": 10, "score_threshold": 0.0,
                                                          "filters": {"repo": "fastapi"}}),
                                             settings=settings, embedder=embedder, store=store)
                return [(i.source, i.score) for i in pack.items]

            best, relevant = [], []
            for q in load_queries(corpus.queries):
                wanted = set(q.relevant) | set(q.secondary)
                good = [s for source, s in scores(q.query) if source in wanted]
                if good:
                    best.append(max(good))
                    relevant.extend(good)
            relevant.sort()
            nonsense = max((s for _, s in scores("qwxz plorf")), default=0.0)
        finally:
            runtime.close_all()
            get_settings.cache_clear()
    print(f"threshold {THRESHOLDS.get(settings.model_name)} for {settings.model_name}")
    print(f"lowest best relevant item of a query: {min(best):.3f} ({len(best)} queries)")
    print(f"10th percentile of relevant items in the top 10: {relevant[len(relevant) // 10]:.3f}")
    print(f"best item for the nonsense query 'qwxz plorf': {nonsense:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
