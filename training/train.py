"""`python -m training.train --out DIR`: the shipped static model, tuned for code by contrastive training.

Why: the shipped table is a distillation of a general-English sentence model; questions that
describe behaviour miss the code that does it. Starting from that table, each token vector is
moved so that a doc comment's first sentence lands near the chunk it documents (comment taken
out), against every other chunk of the batch (in-batch negatives, symmetric InfoNCE), with a pull
back toward the starting table so what it knew of English stays. The model's shape, tokenizer and
load path do not change: only `embeddings.safetensors` and `config.json` differ.

Everything comes from registries (training/sources.py); the packages it needs are pinned in
training/requirements.txt. Deterministic given --seed on the same thread count (torch runs with
deterministic algorithms); see BENCHMARKS.md for its wall time here.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench.languages import model_dir

from .log import speaker

ROOT = Path(__file__).resolve().parent.parent
#: The distilled table (scripts/build_static_model.py) as shipped before this training existed.
BASE_MODEL = "git:ccb2110"
WORK = ROOT / "training" / "work"


say = speaker("train")


def build_pairs(cap: int, seed: int, negatives: bool = False) -> list:
    from .pairs import mine, write_jsonl
    from .sources import fetch_all

    pairs = []
    for corpus, root in fetch_all(say):
        found = mine(root, corpus.repo, cap, seed, negatives)
        say(f"{corpus.language:<10} {corpus.repo:<24} {len(found):>6} pairs")
        pairs.extend(found)
    write_jsonl(pairs, WORK / f"pairs-cap{cap}-seed{seed}.jsonl")  # what was trained on, to inspect or reuse
    return pairs


def tokenize(texts: list[str], tokenizer, unk: int, limit: int) -> list[list[int]]:
    from moonmind_worker.embedding.base import split_identifiers

    out = []
    for i in range(0, len(texts), 2048):
        enc = tokenizer.encode_batch([split_identifiers(t) for t in texts[i:i + 2048]], add_special_tokens=False)
        out.extend([t for t in e.ids[:limit] if t != unk] for e in enc)
    return out


def batches(keep: list[int], sources: list[str], size: int, same_source: bool, rng: random.Random) -> list[list[int]]:
    """Shuffled batches; with `same_source`, each batch drawn from one repository where it can be.

    Why: a search is scoped to one repository, so the negatives that matter are its other chunks;
    a batch mixing repositories teaches what tells repositories apart, which a scoped search never needs.
    """
    order = list(zip(sources, keep))
    rng.shuffle(order)
    if not same_source:
        ids = [i for _, i in order]
        return [ids[b:b + size] for b in range(0, len(ids) - size + 1, size)]
    order.sort(key=lambda t: t[0])  # stable: shuffled within each source
    ids = [i for _, i in order]
    out = [ids[b:b + size] for b in range(0, len(ids) - size + 1, size)]
    rng.shuffle(out)
    return out


def prepare(base: Path, seed: int, threads: int):
    """Torch seeded and deterministic on `threads`; the base model's tokenizer (no padding) and its unknown token's id."""
    import torch
    from tokenizers import Tokenizer

    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    tokenizer = Tokenizer.from_file(str(base / "tokenizer.json"))
    tokenizer.no_padding()
    return tokenizer, tokenizer.token_to_id("[UNK]")


def train(pairs: list, *, base: Path, seed: int, epochs: int, batch: int, lr: float, tau: float, pull: float,
          threads: int, same_source: bool = False, hard_negatives: bool = False):
    import numpy as np
    import torch
    import torch.nn.functional as F
    from safetensors.numpy import load_file

    tokenizer, unk = prepare(base, seed, threads)
    queries = tokenize([p.query for p in pairs], tokenizer, unk, 512)
    docs = tokenize([p.positive for p in pairs], tokenizer, unk, 512)
    negatives = tokenize([p.negative if hard_negatives else "" for p in pairs], tokenizer, unk, 512)
    keep = [i for i in range(len(pairs)) if queries[i] and docs[i]]
    say(f"{sum(1 for i in keep if negatives[i])} of them with a hard negative")
    say(f"{len(keep)} pairs with tokens on both sides")

    start = torch.from_numpy(load_file(str(base / "embeddings.safetensors"))["embeddings"].astype(np.float32))
    table = torch.nn.Parameter(start.clone())
    opt = torch.optim.Adam([table], lr=lr)

    def embed(rows: list[list[int]]) -> torch.Tensor:
        flat = torch.tensor([t for r in rows for t in r], dtype=torch.long)
        offsets = torch.tensor([0] + [len(r) for r in rows[:-1]], dtype=torch.long).cumsum(0)
        return F.normalize(F.embedding_bag(flat, table, offsets, mode="mean"), dim=1)

    rng = random.Random(seed)
    for epoch in range(epochs):
        total, steps, began = 0.0, 0, time.monotonic()
        for idx in batches(keep, [pairs[i].source for i in keep], batch, same_source, rng):
            q, d = embed([queries[i] for i in idx]), embed([docs[i] for i in idx])
            logits = q @ d.T / tau
            target = torch.arange(len(idx))
            hard = [negatives[i] for i in idx if negatives[i]]
            # a query also competes against the batch's hard negatives; a chunk's own row stays the batch's queries
            wide = torch.cat([logits, q @ embed(hard).T / tau], dim=1) if hard else logits
            loss = (F.cross_entropy(wide, target) + F.cross_entropy(logits.T, target)) / 2
            loss = loss + pull * (table - start).pow(2).sum(dim=1).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            total, steps = total + float(loss.detach()), steps + 1
        say(f"epoch {epoch + 1}/{epochs}: loss {total / max(steps, 1):.4f} ({time.monotonic() - began:.0f} s)")
    return table.detach().numpy()


def write_model(table, out: Path, base: Path, meta: dict, tokenizer: str | None = None) -> None:
    """A model directory: `table` as float16, `meta` as config.json, base's NOTICE, and base's tokenizer
    (or `tokenizer`, a tokenizer.json's text, for a table whose vocabulary differs: training/vocab.py)."""
    import numpy as np
    from safetensors.numpy import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file({"embeddings": np.asarray(table, dtype=np.float16)}, str(out / "embeddings.safetensors"))
    for name in ("tokenizer.json", "NOTICE") if tokenizer is None else ("NOTICE",):
        if (base / name).exists() and (base / name).resolve() != (out / name).resolve():
            shutil.copy(base / name, out / name)
    if tokenizer is not None:
        (out / "tokenizer.json").write_text(tokenizer)
    (out / "config.json").write_text(json.dumps(meta, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m training.train", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="model directory to write")
    ap.add_argument("--base", default=BASE_MODEL,
                    help="starting model: a directory, or git:REV for the one shipped at a commit (default %(default)s)")
    ap.add_argument("--name", default="moonmind-static-code-256")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cap", type=int, default=3000, help="pairs per source at most")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--lr", type=float, default=0.003)
    ap.add_argument("--tau", type=float, default=0.05)
    ap.add_argument("--pull", type=float, default=0.01, help="weight of the squared distance to the starting table")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--same-source", action="store_true", help="draw each batch from one repository where it can")
    ap.add_argument("--hard-negatives", action="store_true",
                    help="also score each query against chunks that use what its positive defines (BENCHMARKS.md: no gain)")
    ap.add_argument("--pairs", default=None, help="reuse a pairs.jsonl instead of mining")
    args = ap.parse_args(argv)
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="moonmind-train-") as tmp:
        return run(args, model_dir(args.base, Path(tmp)), began)


def run(args: argparse.Namespace, base: Path, began: float) -> int:
    if args.pairs:
        from .pairs import read_jsonl

        pairs = read_jsonl(Path(args.pairs))
    else:
        pairs = build_pairs(args.cap, args.seed, args.hard_negatives)
    mined = time.monotonic() - began
    by_language = Counter(p.language for p in pairs)
    table = train(pairs, base=base, seed=args.seed, epochs=args.epochs, batch=args.batch, lr=args.lr,
                  tau=args.tau, pull=args.pull, threads=args.threads, same_source=args.same_source,
                  hard_negatives=args.hard_negatives)
    base_meta = json.loads((base / "config.json").read_text())
    digest = hashlib.sha256(b"".join(sorted(f"{p.query}\0{p.positive}".encode() for p in pairs))).hexdigest()
    meta = {
        "name": args.name,
        "dimensions": base_meta["dimensions"],
        "vocab_size": base_meta["vocab_size"],
        "source_model": base_meta.get("source_model"),
        "source_sha256": base_meta.get("source_sha256"),
        "method": (f"{base_meta.get('method')}; then contrastive (doc comment -> chunk) training by "
                   f"training/train.py: seed {args.seed}, {args.epochs} epochs, batch {args.batch}, lr {args.lr}, "
                   f"tau {args.tau}, pull {args.pull}, hard negatives {'on' if args.hard_negatives else 'off'}, "
                   f"batches {'per repository' if args.same_source else 'mixed'}"),
        "training_pairs": len(pairs),
        "training_pairs_by_language": dict(sorted(by_language.items())),
        "training_pairs_sha256": digest,
        "normalize": True,
        "has_token_weights": False,
    }
    write_model(table, Path(args.out), base, meta)
    say(f"wrote {args.out}: {len(pairs)} pairs, mining {mined:.0f} s, all {time.monotonic() - began:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
