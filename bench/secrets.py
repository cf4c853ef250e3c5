"""`python -m bench.secrets`: what keeping secrets out of the index costs, in time and in text a reader needed.

Two measures (issue 52):
* cost: Django's cold index, one-shot (`MOONMIND_OWNER=off`), each round in a fresh home, with
  redaction on and off interleaved (on, off, off, on, ...: the box drifts 1.5-2x between runs, so each
  pair is compared in the same minutes); wall and CPU seconds per setting, and the median ratio of pairs.
* false positives: every file of the corpora chunked as the indexer chunks it, then redacted; chunks
  changed per 10k chunks, by kind, with the changed lines (each one a secret or a false positive: read
  them). Django is the dev set the rules were written against; the language sets' projects
  (`bench.languages`, fetched once) are the held-out ones.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections import Counter
from pathlib import Path

from moonmind_worker.text.chunking import chunk_text
from moonmind_worker.text.files import read_text, walk
from moonmind_worker.text.secrets import redact

from .languages import LANGUAGES, fetch
from .measure import run_tree_measured
from .owner import MOONMIND, django_source, env_for


def say(msg: str) -> None:
    sys.stderr.write(f"[secrets] {msg}\n")
    sys.stderr.flush()


def cost(source: Path, rounds: int) -> dict[str, object]:
    """Cold index walls (s) and CPU (s) with redaction on and off, interleaved; the median of on/off pairs."""
    walls: dict[str, list[float]] = {"on": [], "off": []}
    cpus: dict[str, list[float]] = {"on": [], "off": []}
    order = [("on", "off") if i % 2 == 0 else ("off", "on") for i in range(rounds)]
    for i, pair in enumerate(order):
        for setting in pair:
            with tempfile.TemporaryDirectory(prefix="moonmind-secrets-") as home:
                env = env_for(Path(home)) | {"MOONMIND_REDACT_SECRETS": setting}
                r = run_tree_measured([MOONMIND, "rag", "index", str(source), "--repo", "django"], env)
                if r.code != 0:
                    raise RuntimeError(f"index failed ({setting}): {r.stderr[-400:]}")
                walls[setting].append(r.wall_s)
                cpus[setting].append(r.cpu_s)
                say(f"round {i + 1}: redaction {setting}: {r.wall_s:.2f} s wall, {r.cpu_s:.1f} CPU-s")
    ratios = [on / off for on, off in zip(walls["on"], walls["off"])]
    return {"walls": walls, "cpus": cpus, "median_ratio": statistics.median(ratios)}


def false_positives(name: str, root: Path, examples: int) -> dict[str, object]:
    """Chunks (indexer settings: 1500 chars, 2 overlap lines) that redaction changes, by kind, and the changed lines."""
    chunks = changed = 0
    kinds: Counter[str] = Counter()
    lines: list[str] = []
    for rel, path in walk(root):
        text, _ = read_text(path, 1_000_000)
        if text is None:
            continue
        for c in chunk_text(text, rel, 1500, 2, redact=False):
            chunks += 1
            out, found = redact(c.text)
            if found:
                changed += 1
                kinds.update(found)
                for before, after in zip(c.text.splitlines(), out.splitlines()):
                    if before != after and len(lines) < examples:
                        lines.append(f"{name}:{rel}: {before.strip()[:120]}")
    return {"set": name, "chunks": chunks, "changed": changed, "per_10k": 1e4 * changed / max(chunks, 1),
            "kinds": dict(kinds), "examples": lines}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.secrets", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=4, help="cold index pairs (on, off) for the cost (default 4; 0: skip)")
    ap.add_argument("--examples", type=int, default=12, help="changed lines shown per set")
    ap.add_argument("--no-languages", action="store_true", help="Django alone for the false positives")
    args = ap.parse_args(argv)
    django = django_source()
    sets = [("django (dev)", django)]
    if not args.no_languages:
        sets += [(f"{c.repo} (held out)", fetch(c)) for c in LANGUAGES]
    print("| set | chunks | chunks changed | per 10k | kinds |\n|---|---|---|---|---|")
    shown = []
    for name, root in sets:
        r = false_positives(name, root, args.examples)
        print(f"| {r['set']} | {r['chunks']} | {r['changed']} | {r['per_10k']:.1f} | "
              f"{', '.join(f'{k} {n}' for k, n in sorted(r['kinds'].items())) or '-'} |")
        shown += r["examples"]
    print("\nchanged lines (each a secret or a false positive):")
    for line in shown:
        print(f"- {line}")
    if args.rounds:
        r = cost(django, args.rounds)
        w, c = r["walls"], r["cpus"]
        print(f"\nDjango cold index, {args.rounds} interleaved pairs: redaction on {statistics.median(w['on']):.2f} s "
              f"(CPU {statistics.median(c['on']):.1f} s), off {statistics.median(w['off']):.2f} s "
              f"(CPU {statistics.median(c['off']):.1f} s); median on/off {r['median_ratio']:.3f}")
        print(f"walls on {[round(x, 2) for x in w['on']]}, off {[round(x, 2) for x in w['off']]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
