"""`moonmind rag index --dry-run`: what an index run of a tree would do, without doing any of it.

It walks, reads and chunks with the indexer's own functions (`text.files.walk`, `TreeReader`,
`text.chunking.chunk_text` with the same settings, `indexer.count_seen` and `NO_TEXT`), so its
counts are a first run's counts. It opens no store, starts no owner and writes nothing: the
home directory is not even created.

Time: the walk, reading and chunking are this run's own (measured); embedding is measured on a
sample of this tree's chunks with the configured local model and scaled to every chunk, in one
process. The estimate leaves out the store's writes and the worker processes a large run embeds
on, so it is the order of the time, not a promise. A hosted model is not called (a sample would
be billed and needs its key): its time is not estimated, its cost is.

Cost: tokens (the embedded text, ~4 characters a token, as `token_count`) times the model's
price in USD per million input tokens: MOONMIND_EMBEDDING_PRICE_PER_MTOK when set, else
`LIST_PRICES` below, else unknown (said so, never guessed).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ..errors import MoonmindError
from ..settings import Settings
from ..text.chunking import chunk_text, estimate_tokens, language_of
from ..text.files import Skipped, TreeReader, WalkRules, walk
from .indexer import NO_TEXT, IndexSummary, build_points, content_hash, count_seen
from .points import embedding_text

#: Chunks embedded to measure the local model's throughput.
SAMPLE_CHUNKS = 256

#: USD per million input tokens, standard (not batch) tier, as the providers' pricing pages list
#: them (platform.openai.com/docs/pricing; ai.google.dev/gemini-api/docs/pricing), checked 2026-11 through
#: public pages quoting them, not the providers' pages themselves.
#: Prices change: MOONMIND_EMBEDDING_PRICE_PER_MTOK overrides this table.
LIST_PRICES: dict[str, float] = {
    "text-embedding-3-small": 0.02,
    "text-embedding-3-large": 0.13,
    "text-embedding-ada-002": 0.10,
    "gemini-embedding-001": 0.15,
}
PRICE_SOURCE = "the list price in moonmind_worker/indexing/dry_run.py (LIST_PRICES; standard tier, checked 2026-11)"

#: Providers that run on this machine: embedding costs nothing but time.
LOCAL_PROVIDERS = ("static", "ollama")


def survey(root: Path, settings: Settings) -> tuple[IndexSummary, dict[str, Any], list]:
    """Walk, read and chunk `root` as `index_repository` does: (summary with its counts, figures, a sample batch)."""
    summary = IndexSummary(repo="", tenant="")
    files = list(walk(root, summary.skipped, rules=WalkRules.of(settings)))
    summary.files_seen = count_seen(files, summary.skipped)
    by_language: dict[str, dict[str, int]] = {}
    chunks = bytes_ = tokens = 0
    sample: list[tuple[str, str, list]] = []  # (path, file hash, chunks): the indexer's batch shape
    sampled = 0
    with TreeReader(root.resolve()) as reader:
        for rel, _ in files:
            text, reason = reader.read_text(rel, settings.max_file_bytes)
            if text is None:
                summary.skipped.append(Skipped(rel, reason or "unreadable"))
                continue
            found = chunk_text(text, rel, settings.chunk_chars, settings.chunk_overlap_lines, redact=settings.redact_secrets == "on")
            if not found:
                summary.skipped.append(Skipped(rel, NO_TEXT))
                continue
            summary.files_indexed += 1
            size = len(text.encode("utf-8", "surrogatepass"))
            lang = by_language.setdefault(language_of(rel), {"files": 0, "chunks": 0, "bytes": 0})
            lang["files"] += 1
            lang["chunks"] += len(found)
            lang["bytes"] += size
            chunks += len(found)
            bytes_ += size
            tokens += sum(estimate_tokens(embedding_text(rel, c)) for c in found)
            if sampled < SAMPLE_CHUNKS:
                sample.append((rel, content_hash(text), found[:SAMPLE_CHUNKS - sampled]))
                sampled += len(sample[-1][2])
    summary.chunks_written = chunks
    ordered = dict(sorted(by_language.items(), key=lambda kv: (-kv[1]["files"], kv[0])))
    return summary, {"languages": ordered, "chunks": chunks, "bytes": bytes_, "tokens": tokens}, sample


def price_per_mtok(settings: Settings) -> tuple[float | None, str]:
    """(USD per million tokens, where that figure comes from); None when nothing says."""
    if settings.embedding_price_per_mtok is not None:
        return settings.embedding_price_per_mtok, "MOONMIND_EMBEDDING_PRICE_PER_MTOK"
    price = LIST_PRICES.get(settings.model_name)
    if price is not None:
        return price, PRICE_SOURCE
    return None, f"no price known for {settings.model_name}: set MOONMIND_EMBEDDING_PRICE_PER_MTOK (USD per million tokens)"


def measure_embedding(settings: Settings, sample: list) -> tuple[float, float]:
    """(seconds to load the model, chunks per second the indexer's own point building reaches on `sample`)."""
    from ..embedding import make_embedder

    started = time.perf_counter()
    embedder = make_embedder(settings)
    embedder.embed_documents(["warm up"])  # the first call loads the model: a cost of its own, not of the rate
    loaded = time.perf_counter()
    build_points(embedder, sample, repo="dry-run", tenant="dry-run")
    chunks = sum(len(c) for _, _, c in sample)
    return loaded - started, chunks / max(time.perf_counter() - loaded, 1e-9)


def dry_run(root: Path, settings: Settings, *, repo: str, tenant: str) -> dict[str, Any]:
    """The dry-run report (JSON-ready); see the module docstring for what each figure rests on."""
    started = time.perf_counter()
    summary, figures, sample = survey(root, settings)
    read_chunk_s = time.perf_counter() - started
    provider, model = settings.embedding_provider, settings.model_name
    hosted = provider not in LOCAL_PROVIDERS
    estimate: dict[str, Any] = {"read_and_chunk_seconds": round(read_chunk_s, 3)}
    if hosted:
        estimate.update(seconds=None, embed_chunks_per_second=None,
                        basis=f"reading and chunking measured; embedding with the hosted {model} not measured "
                              "(a sample would be billed)")
    else:
        try:
            load_s, rate = measure_embedding(settings, sample) if figures["chunks"] else (0.0, None)
        except MoonmindError as err:  # e.g. no Ollama server: the counts still stand
            estimate.update(seconds=None, embed_chunks_per_second=None,
                            basis=f"reading and chunking measured; embedding could not be measured ({err.message})")
        else:
            embed_s = load_s + figures["chunks"] / rate if rate else 0.0
            sampled = sum(len(c) for _, _, c in sample)
            estimate.update(seconds=round(read_chunk_s + embed_s, 1), embed_chunks_per_second=None if rate is None else round(rate, 1),
                            basis=(f"reading and chunking measured on this tree; loading the model, then embedding (with BM25 "
                                   f"and payloads) measured on {sampled} of its chunks with {model} in one process and scaled "
                                   f"to {figures['chunks']}; store writes not included"))
    cost: dict[str, Any] = {"provider": provider, "model": model, "tokens": figures["tokens"]}
    if hosted:
        price, source = price_per_mtok(settings)
        cost.update(usd_per_million_tokens=price, usd=None if price is None else round(figures["tokens"] * price / 1e6, 4),
                    price_source=source)
    else:
        cost.update(usd_per_million_tokens=0.0, usd=0.0, price_source=f"{provider} runs on this machine")
    by_reason = summary.skipped_by_reason()
    return {
        "dry_run": True,
        "path": str(root.resolve()),
        "repo": repo,
        "tenant": tenant,
        "files_seen": summary.files_seen,
        "files_indexed": summary.files_indexed,
        "files_skipped": sum(by_reason.values()),
        "skipped_by_reason": by_reason,
        "dirs_skipped": summary.dirs_skipped,
        "skipped": [{"path": s.path, "reason": s.reason, "kind": s.kind} for s in summary.skipped],
        "chunks": figures["chunks"],
        "bytes": figures["bytes"],
        "languages": figures["languages"],
        "estimate": estimate,
        "cost": cost,
    }


def summary_lines(report: dict[str, Any]) -> list[str]:
    """The human form: what, then how long, then how much."""
    langs = ", ".join(f"{name} {v['files']}" for name, v in report["languages"].items()) or "none"
    reasons = ", ".join(f"{n} {reason}" for reason, n in report["skipped_by_reason"].items())
    lines = [
        f"dry run (nothing written) repo={report['repo']} tenant={report['tenant']}: {report['files_seen']} files seen = "
        f"{report['files_indexed']} to index + {report['files_skipped']} skipped" + (f" ({reasons})" if reasons else ""),
        f"  {report['chunks']} chunks from {report['bytes']:,} bytes; files by language: {langs}",
    ]
    est = report["estimate"]
    if est["seconds"] is None:
        lines.append(f"  time: not estimated ({est['basis']})")
    else:
        lines.append(f"  time: about {est['seconds']:.1f}s here ({est['basis']})")
    cost = report["cost"]
    if cost["usd"] is None:
        lines.append(f"  cost: ~{cost['tokens']:,} tokens for {cost['model']}; {cost['price_source']}")
    elif cost["usd"] == 0 and cost["usd_per_million_tokens"] == 0:
        lines.append(f"  cost: none, {cost['price_source']} (~{cost['tokens']:,} tokens)")
    else:
        lines.append(f"  cost: ~{cost['tokens']:,} tokens x ${cost['usd_per_million_tokens']}/M = ${cost['usd']:.4f} "
                     f"({cost['price_source']})")
    if report["dirs_skipped"]:
        lines.append(f"  {report['dirs_skipped']} directories not read (--json lists them)")
    return lines
