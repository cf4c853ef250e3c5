"""The training corpus holds no repository of any evaluation set (issue 34: held-out discipline)."""

import json
import re
from pathlib import Path

from bench.languages import LANGUAGES, REFERENCE
from training.sources import EXCLUDED, SOURCES

ROOT = Path(__file__).resolve().parent.parent
LANGUAGE_PREFIXES = {"python", "javascript", "typescript", "go", "rust", "ruby", "php", "cpp"}


def _package(spec: str) -> str:
    return re.split(r"==|=|@(?=\d)", spec, maxsplit=1)[0].lower()


def test_no_training_source_is_an_evaluation_repository():
    assert not {c.repo for c in SOURCES} & EXCLUDED


def test_no_training_source_is_an_evaluation_package_at_any_version():
    evaluated = {_package(c.spec) for c in LANGUAGES + REFERENCE}
    assert not {_package(c.spec) for c in SOURCES} & evaluated


def test_every_evaluation_set_names_a_repository_the_training_excludes():
    for path in sorted(ROOT.glob("bench/eval-*.json")):
        language, _, rest = path.stem.removeprefix("eval-").partition("-")  # eval-go-chi -> chi
        name = rest if language in LANGUAGE_PREFIXES and rest else path.stem.removeprefix("eval-")
        assert name.removesuffix("-docs") in EXCLUDED, f"{path.name}: add its repository to training.sources.EXCLUDED"


def test_the_shipped_model_records_the_training_it_had():
    config = json.loads((ROOT / "moonmind_worker/models/static-code-256/config.json").read_text())
    assert config["training_pairs"] > 10_000
    assert set(config["training_pairs_by_language"]) >= {"python", "javascript", "typescript", "go", "rust", "ruby",
                                                          "php", "cpp"}
