"""The fixture repository indexed once per session, copied into each test's MOONMIND_HOME.

Why: indexing through the CLI costs a process start per test; the guardrail,
doctor, secrets and sync tests only need an already-indexed collection, which
a copy of the embedded store's directory gives in milliseconds.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from conftest import FIXTURE_FILES, write_tree


@pytest.fixture(scope="session")
def _index_template(tmp_path_factory) -> Path:
    from moonmind_worker.embedding import StaticEmbedder
    from moonmind_worker.indexer import index_repository
    from moonmind_worker.settings import Settings
    from moonmind_worker.store import EdgeStore

    root = tmp_path_factory.mktemp("prebuilt")
    repo = write_tree(root / "repo", FIXTURE_FILES)
    settings = Settings(moonmind_home=root / "home", qdrant_url=None, collection="moonmind__repo")
    store = EdgeStore(settings.data_dir, settings.collection)
    index_repository(repo, repo="demo", tenant="acme", settings=settings, embedder=StaticEmbedder(), store=store)
    store.close()
    return root


@pytest.fixture
def prebuilt(env, home: Path, tmp_path: Path, _index_template: Path) -> Path:
    """Like conftest's `indexed` (repo=demo, tenant=acme), without running the CLI; returns the repo root."""
    shutil.copytree(_index_template / "home" / "qdrant-edge", home / "qdrant-edge")
    (home / "qdrant-edge" / "moonmind__repo" / "owner.lock").unlink(missing_ok=True)
    return shutil.copytree(_index_template / "repo", tmp_path / "repo")
