"""training/vocab.py: a word added whole starts as what its pieces meant, and every old token keeps its row."""

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

from training.train import write_model
from training.vocab import from_pieces

PIECES = ["[UNK]", "query", "##set", "kw", "##args", "get"]


def _base(root: Path) -> Path:
    tokenizer = Tokenizer(models.WordPiece({t: i for i, t in enumerate(PIECES)}, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    root.mkdir()
    tokenizer.save(str(root / "tokenizer.json"))
    table = np.arange(len(PIECES) * 4, dtype=np.float32).reshape(len(PIECES), 4)
    save_file({"embeddings": table.astype(np.float16)}, str(root / "embeddings.safetensors"))
    return root


def test_a_new_word_is_one_token_whose_row_is_the_mean_of_its_pieces(tmp_path):
    base, out = _base(tmp_path / "base"), tmp_path / "out"
    table, tokenizer_json = from_pieces(["queryset", "kwargs"], base)
    write_model(table, out, base, {"vocab_size": len(table)}, tokenizer=tokenizer_json)

    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert tokenizer.encode("get QuerySet kwargs", add_special_tokens=False).tokens == ["get", "queryset", "kwargs"]
    old = load_file(str(base / "embeddings.safetensors"))["embeddings"]
    new = load_file(str(out / "embeddings.safetensors"))["embeddings"]
    assert new.shape == (len(PIECES) + 2, 4)
    assert (new[: len(PIECES)] == old).all()  # every old id keeps its row
    queryset = tokenizer.token_to_id("queryset")
    assert queryset == len(PIECES)
    assert np.allclose(new[queryset], (old[1].astype(np.float32) + old[2]) / 2)
    assert json.loads((out / "tokenizer.json").read_text())["model"]["vocab"]["kwargs"] == len(PIECES) + 1
