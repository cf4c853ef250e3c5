"""Settings: read once from the environment and `.env`, with the precedence pydantic-settings had."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import ValidationError

from moonmind_worker.settings import Settings


@pytest.fixture
def in_dir(tmp_path, monkeypatch, env):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_environment_is_read_by_alias_case_insensitively(in_dir, monkeypatch):
    monkeypatch.setenv("rag_similarity_top_k", "5")
    monkeypatch.setenv("QDRANT_COLLECTION", "other")
    s = Settings()
    assert s.top_k == 5 and s.collection == "other"
    assert {"top_k", "collection"} <= s.model_fields_set


def test_dotenv_is_read_and_the_real_environment_wins(in_dir, monkeypatch):
    (in_dir / ".env").write_text("RAG_SIMILARITY_TOP_K=7\nOPENAI_API_KEY=sk-from-dotenv\nMOONMIND_REPO=dot\n")
    monkeypatch.setenv("MOONMIND_REPO", "real")
    s = Settings()
    assert s.top_k == 7 and s.openai_api_key.get_secret_value() == "sk-from-dotenv" and s.repo == "real"
    assert Settings(_env_file=None).top_k == 8


def test_keyword_arguments_win_by_name_or_alias(in_dir, monkeypatch):
    monkeypatch.setenv("QDRANT_URL", "http://example:6333")
    assert Settings(QDRANT_URL=":memory:").qdrant_url == ":memory:"
    assert Settings(qdrant_url=None).qdrant_url is None
    assert Settings().qdrant_url == "http://example:6333"


def test_invalid_values_are_refused(in_dir, monkeypatch):
    monkeypatch.setenv("RAG_SIMILARITY_TOP_K", "0")
    with pytest.raises(ValidationError):
        Settings()


def test_search_path_imports_neither_pydantic_settings_nor_remote_clients(env, indexed):
    code = (
        "import sys; from moonmind_worker.cli import main; "
        "rc = main(['rag', 'search', '--query', 'bearer token', '--filters', 'repo=demo']); "
        "bad = [m for m in ('pydantic_settings', 'qdrant_client', 'openai', 'celery', 'fastapi') if m in sys.modules]; "
        "print('LOADED', bad, rc)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120).stdout
    assert "LOADED [] 0" in out
