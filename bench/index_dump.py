"""Every point a cold `moonmind rag index` writes, as one line each: the proof that an indexing change kept the data.

`python -m bench.index_dump OUT.jsonl [--source DIR]` runs a real `moonmind rag index` of DIR (default:
the Django 5.1.4 source, `bench.owner.django_source`) into a scratch MOONMIND_HOME, then reads every
point back from the shard: its id, a digest of its payload (every field but `indexed_at`, the
wall-clock time of the run), of its dense vector's float32 bytes and of its sparse (BM25) vector.
Run it on the code before and after a change and compare with `cmp` (or `--compare OTHER.jsonl`):
identical files mean the same chunk boundaries, texts, payloads, embeddings and BM25 terms, bit for bit.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:32]


def dump(source: Path, out: Path) -> int:
    home = Path(tempfile.mkdtemp(prefix="moonmind-index-dump-"))
    env = {**os.environ, "MOONMIND_HOME": str(home), "MOONMIND_OWNER": "off"}
    env.pop("QDRANT_URL", None)
    try:
        run = subprocess.run([sys.executable, "-m", "moonmind_worker", "rag", "index", str(source), "--repo", "dump"],
                             env=env, capture_output=True, text=True)
        if run.returncode != 0:
            raise SystemExit(f"index failed: {run.stderr[-2000:]}")
        print(run.stdout.strip(), file=sys.stderr)
        import numpy as np
        from qdrant_edge import EdgeShard, ScrollRequest

        from moonmind_worker.store.edge_payloads import unpack  # the payload as written, whichever layout stored it

        shard = EdgeShard.load(str(next(home.glob("qdrant-edge/*/shard"))))
        rows, offset = [], None
        while True:
            records, offset = shard.scroll(ScrollRequest(offset=offset, limit=2048, with_payload=True, with_vector=True))
            for r in records:
                payload = {k: v for k, v in unpack(r.payload).items() if k != "indexed_at"}
                dense = np.asarray(r.vector["dense"], dtype=np.float32)
                sparse = r.vector["bm25"]
                rows.append({
                    "id": str(r.id),
                    "path": payload.get("path"),
                    "seq": payload.get("chunk_sequence"),
                    "payload": _digest(json.dumps(payload, sort_keys=True, ensure_ascii=False).encode()),
                    "dense": _digest(dense.tobytes()),
                    "sparse": _digest(json.dumps([list(sparse.indices), [float(v) for v in sparse.values]]).encode()),
                })
            if offset is None:
                break
        shard.close()
    finally:
        shutil.rmtree(home, ignore_errors=True)
    rows.sort(key=lambda r: (r["path"], r["seq"], r["id"]))
    out.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    return len(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="where to write the dump (JSON lines, sorted by path and chunk)")
    ap.add_argument("--source", default=None, help="tree to index (default: the Django 5.1.4 source)")
    ap.add_argument("--compare", default=None, help="an earlier dump: exit 1 and name the first difference unless identical")
    args = ap.parse_args()
    if args.source:
        source = Path(args.source)
    else:
        from .owner import django_source

        source = django_source()
    n = dump(source, Path(args.out))
    whole = _digest(Path(args.out).read_bytes())
    print(f"{n} points, dump digest {whole}")
    if args.compare:
        mine, theirs = Path(args.out).read_text().splitlines(), Path(args.compare).read_text().splitlines()
        if mine == theirs:
            print(f"identical to {args.compare}")
            return
        first = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), min(len(mine), len(theirs)))
        print(f"DIFFERENT from {args.compare} ({len(mine)} vs {len(theirs)} points); first difference at line {first + 1}:")
        print("  this:  " + (mine[first] if first < len(mine) else "(none)"))
        print("  other: " + (theirs[first] if first < len(theirs) else "(none)"))
        raise SystemExit(1)


if __name__ == "__main__":
    main()
