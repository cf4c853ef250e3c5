"""Retrieval quality, measured: run a query file through the real pipeline and score it.

Why: retrieval changes are only improvements if a number says so. The query
file format is the one of `shared/eval/fastapi.json`: a `queries` list of
`{query, relevant, secondary, category, repo?}`. Metrics are file-level:

* the ranked list is the distinct `source` paths of the pack's items, each at
  its first occurrence;
* a query's targets are `relevant + secondary`, with binary gain;
* NDCG@k = DCG@k / IDCG@k, IDCG over min(k, number of targets);
* recall@k = share of targets in the first k files; MRR = 1 / rank of the
  first target file (0 when none is in the list); hit@3 = first target file
  within the first 3 files.

A query *fails* when no target file is among the first 3 files; the report
lists what came back instead. Low scores are results, not errors.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from ..errors import MoonmindError


@dataclass(frozen=True)
class EvalQuery:
    query: str
    relevant: tuple[str, ...]
    secondary: tuple[str, ...] = ()
    category: str = "uncategorised"
    repo: str | None = None

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.relevant + self.secondary))


@dataclass
class QueryResult:
    query: str
    category: str
    ndcg: float
    recall: float
    reciprocal_rank: float
    first_target_rank: int | None
    latency_ms: float
    files: list[str]
    targets: list[str]


@dataclass
class CategoryReport:
    queries: int
    ndcg: float
    recall: float
    mrr: float
    hit_at_3: float


@dataclass
class EvalReport:
    queries: int
    k: int
    top_k: int
    ndcg: float
    recall: float
    mrr: float
    hit_at_3: float
    latency_p50_ms: float
    latency_p95_ms: float
    categories: dict[str, CategoryReport]
    failed: list[QueryResult]
    results: list[QueryResult] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


# ------------------------------------------------------------------ metrics ---


def distinct_files(paths: list[str]) -> list[str]:
    """Paths in result order, each kept at its first occurrence."""
    return list(dict.fromkeys(paths))


def ndcg_at_k(files: list[str], targets: set[str] | tuple[str, ...], k: int) -> float:
    """File-level NDCG@k with binary gain; IDCG over min(k, number of targets)."""
    targets = set(targets)
    if not targets:
        return 0.0
    dcg = sum(1.0 / math.log2(rank + 2) for rank, f in enumerate(distinct_files(files)[:k]) if f in targets)
    idcg = sum(1.0 / math.log2(rank + 2) for rank in range(min(k, len(targets))))
    return dcg / idcg


def recall_at_k(files: list[str], targets: set[str] | tuple[str, ...], k: int) -> float:
    targets = set(targets)
    if not targets:
        return 0.0
    return len(targets & set(distinct_files(files)[:k])) / len(targets)


def first_target_rank(files: list[str], targets: set[str] | tuple[str, ...]) -> int | None:
    """1-based rank of the first target file, or None."""
    targets = set(targets)
    for rank, f in enumerate(distinct_files(files), 1):
        if f in targets:
            return rank
    return None


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    idx = max(0, math.ceil(q / 100 * len(ordered)) - 1)
    return ordered[idx]


# ------------------------------------------------------------------ loading ---


#: Query files and job manifests are small JSON documents; a larger one is a mistake.
CONTROL_FILE_MAX_BYTES = 16 << 20


def load_queries(path: str | Path) -> list[EvalQuery]:
    """Read and validate a query file; a malformed file is a usage error naming the problem."""
    from ..text.files import Unreadable, read_regular

    p = Path(path)
    try:
        data = json.loads(read_regular(p, CONTROL_FILE_MAX_BYTES)[0].decode("utf-8"))
    except FileNotFoundError:
        raise MoonmindError("invalid_argument", f"Query file {path} does not exist.", "Pass --queries FILE.") from None
    except Unreadable as exc:
        raise MoonmindError("invalid_argument", f"Query file {path} was not read: {exc}.", "Pass a JSON query file.") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MoonmindError(
            "invalid_argument", f"Query file {path} is not readable JSON: {exc}.", "Fix the file (see docs/retrieval.md, `rag eval`)."
        ) from None
    raw = data.get("queries") if isinstance(data, dict) else data
    if not isinstance(raw, list) or not raw:
        raise MoonmindError(
            "invalid_argument",
            f"Query file {path} has no `queries` list.",
            'Write {"queries": [{"query": ..., "relevant": [...], "secondary": [...], "category": ...}]}.',
        )
    out = []
    for n, q in enumerate(raw):
        if not isinstance(q, dict) or not isinstance(q.get("query"), str) or not q["query"].strip():
            raise MoonmindError(
                "invalid_argument", f"Query #{n} in {path} has no non-empty `query` string.", "Fix that entry."
            )
        relevant, secondary = q.get("relevant", []), q.get("secondary", [])
        if not _str_list(relevant) or not _str_list(secondary) or not (relevant or secondary):
            raise MoonmindError(
                "invalid_argument",
                f"Query #{n} ({q['query']!r}) needs `relevant` (and optional `secondary`) as lists of paths.",
                "List at least one expected file path.",
            )
        out.append(
            EvalQuery(
                query=q["query"],
                relevant=tuple(relevant),
                secondary=tuple(secondary),
                category=str(q.get("category") or "uncategorised"),
                repo=q.get("repo"),
            )
        )
    return out


def _str_list(v: object) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


# ------------------------------------------------------------------ running ---


def score_query(q: EvalQuery, files: list[str], k: int, latency_ms: float) -> QueryResult:
    files = distinct_files(files)
    rank = first_target_rank(files, q.targets)
    return QueryResult(
        query=q.query,
        category=q.category,
        ndcg=ndcg_at_k(files, q.targets, k),
        recall=recall_at_k(files, q.targets, k),
        reciprocal_rank=1.0 / rank if rank else 0.0,
        first_target_rank=rank,
        latency_ms=round(latency_ms, 2),
        files=files[:k],
        targets=list(q.targets),
    )


def summarise(results: list[QueryResult], k: int, top_k: int) -> EvalReport:
    def mean(xs: list[float]) -> float:
        return round(statistics.fmean(xs), 4) if xs else 0.0

    def hit3(rs: list[QueryResult]) -> float:
        return mean([1.0 if r.first_target_rank and r.first_target_rank <= 3 else 0.0 for r in rs])

    cats: dict[str, list[QueryResult]] = {}
    for r in results:
        cats.setdefault(r.category, []).append(r)
    latencies = [r.latency_ms for r in results]
    return EvalReport(
        queries=len(results),
        k=k,
        top_k=top_k,
        ndcg=mean([r.ndcg for r in results]),
        recall=mean([r.recall for r in results]),
        mrr=mean([r.reciprocal_rank for r in results]),
        hit_at_3=hit3(results),
        latency_p50_ms=round(percentile(latencies, 50), 2),
        latency_p95_ms=round(percentile(latencies, 95), 2),
        categories={
            name: CategoryReport(
                queries=len(rs),
                ndcg=mean([r.ndcg for r in rs]),
                recall=mean([r.recall for r in rs]),
                mrr=mean([r.reciprocal_rank for r in rs]),
                hit_at_3=hit3(rs),
            )
            for name, rs in sorted(cats.items())
        },
        failed=[r for r in results if not (r.first_target_rank and r.first_target_rank <= 3)],
        results=results,
    )


def run_eval(
    queries: list[EvalQuery],
    search: Callable[[EvalQuery], list[str]],
    *,
    k: int = 10,
    top_k: int = 10,
) -> EvalReport:
    """Score every query; `search` returns the ranked source paths of one query's pack."""
    results = []
    for q in queries:
        started = time.perf_counter()
        files = search(q)
        results.append(score_query(q, files, k, (time.perf_counter() - started) * 1000))
    return summarise(results, k, top_k)


def format_report(report: EvalReport) -> str:
    """A human-readable report: totals, per category, then the failed queries."""
    lines = [
        f"queries={report.queries} k={report.k} top_k={report.top_k}",
        f"NDCG@{report.k}     {report.ndcg:.4f}",
        f"recall@{report.k}   {report.recall:.4f}",
        f"MRR         {report.mrr:.4f}",
        f"hit@3       {report.hit_at_3:.4f}",
        f"latency     p50 {report.latency_p50_ms:.1f} ms, p95 {report.latency_p95_ms:.1f} ms (whole query)",
        "",
        f"{'category':<16}{'n':>4}{'NDCG':>9}{'recall':>9}{'MRR':>9}{'hit@3':>9}",
    ]
    for name, c in report.categories.items():
        lines.append(f"{name:<16}{c.queries:>4}{c.ndcg:>9.4f}{c.recall:>9.4f}{c.mrr:>9.4f}{c.hit_at_3:>9.4f}")
    lines.append("")
    if report.failed:
        lines.append(f"failed ({len(report.failed)}): no target file in the first 3 files")
        for r in report.failed:
            where = f"first target at rank {r.first_target_rank}" if r.first_target_rank else "no target in the list"
            lines.append(f"- {r.query!r} [{r.category}] NDCG={r.ndcg:.3f}, {where}")
            lines.append(f"    expected: {', '.join(r.targets)}")
            lines.append(f"    got:      {', '.join(r.files[:5]) or '(nothing)'}")
    else:
        lines.append("failed: none")
    return "\n".join(lines) + "\n"
