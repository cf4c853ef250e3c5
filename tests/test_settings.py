"""Settings: read once from the environment and `.env`, with the precedence pydantic-settings had,
without pydantic; an invalid value is an `invalid_setting` error naming the variable and the rule."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from moonmind_worker.errors import EXIT_USAGE, MoonmindError
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


@pytest.mark.parametrize(
    ("var", "value", "rule"),
    [
        ("RAG_SIMILARITY_TOP_K", "0", "an integer between 1 and 50"),
        ("RAG_SIMILARITY_TOP_K", "eight", "an integer between 1 and 50"),
        ("MOONMIND_EMBEDDING_BATCH_SIZE", "0", "an integer greater than 0"),
        ("MOONMIND_CHUNK_CHARS", "199", "an integer no less than 200"),
        ("RAG_SCORE_THRESHOLD", "1.5", "a number between 0 and 1"),
        ("MOONMIND_EVENTS_TIMEOUT_S", "11", "a number greater than 0 and no more than 10"),
        ("STATSD_PORT", "65536", "an integer greater than 0 and less than 65536"),
        ("MOONMIND_EMBEDDING_PROVIDER", "gemini", "one of static, openai, google, ollama, cohere"),
        ("MOONMIND_RAG_EXECUTION", "async", "one of sync, queue"),
        ("MOONMIND_SEARCH_QUEUE", "", "a non-empty string"),
    ],
)
def test_invalid_values_are_refused_naming_the_variable_value_and_rule(in_dir, monkeypatch, var, value, rule):
    monkeypatch.setenv(var, value)
    with pytest.raises(MoonmindError) as info:
        Settings()
    err = info.value
    assert err.code == "invalid_setting" and err.exit_code == EXIT_USAGE
    assert f"{var}={value!r} (from the environment) must be {rule}" in err.message
    assert err.action.startswith(f"Set {var} to {rule}, or unset it")


def test_an_invalid_value_from_dotenv_says_so_and_every_bad_one_is_named(in_dir):
    (in_dir / ".env").write_text("rag_similarity_top_k=51\nMOONMIND_MAX_QUERY_CHARS=-1\n")
    with pytest.raises(MoonmindError) as info:
        Settings()
    msg = info.value.message
    assert "rag_similarity_top_k='51' (from .env)" in msg and "MOONMIND_MAX_QUERY_CHARS='-1' (from .env)" in msg
    assert "(default 8)" in info.value.action and "(default 2000)" in info.value.action


def test_lax_coercions_and_blank_is_unset(in_dir):
    s = Settings(RAG_SIMILARITY_TOP_K=" 5 ", MOONMIND_CHUNK_CHARS="1500.0", QDRANT_TIMEOUT_S="2", QDRANT_URL="",
                 MOONMIND_ARTIFACTS_DIR=" ", STATSD_HOST="")
    assert (s.top_k, s.chunk_chars, s.qdrant_timeout_s) == (5, 1500, 2.0)
    assert s.qdrant_url is None and s.artifacts_dir is None and s.statsd_host is None and s.embedded_store
    for bad in ({"top_k": 5.5}, {"top_k": True}, {"score_threshold": "nan"}, {"embedding_dimensions": ""}):
        with pytest.raises(MoonmindError):
            Settings(**bad)


def test_paths_are_expanded_defaults_included(in_dir, monkeypatch):
    monkeypatch.setenv("HOME", str(in_dir))
    monkeypatch.delenv("MOONMIND_HOME")
    s = Settings(MOONMIND_GATEWAY_TOKENS_FILE="~/tokens.json", MOONMIND_ARTIFACTS_DIR="~/artifacts")
    assert s.moonmind_home == in_dir / ".moonmind" and s.data_dir == in_dir / ".moonmind" / "qdrant-edge"
    assert s.tokens_file == in_dir / "tokens.json" and s.artifacts_root == in_dir / "artifacts"


def test_secrets_never_show_in_repr_str_or_errors(in_dir):
    s = Settings(OPENAI_API_KEY="sk-sentinel-1", MOONMIND_RETRIEVAL_TOKEN="tok-sentinel-2")
    assert s.openai_api_key.get_secret_value() == "sk-sentinel-1"
    assert s.secrets() == ["sk-sentinel-1", "tok-sentinel-2"]
    for text in (repr(s), str(s), repr(s.openai_api_key), str(s.retrieval_token)):
        assert "sentinel" not in text
    with pytest.raises(MoonmindError) as info:
        Settings(OPENAI_API_KEY=12345)
    assert "OPENAI_API_KEY (from a keyword argument) must be a string" in info.value.message
    assert "12345" not in info.value.message + info.value.action


def test_model_copy_fields_set_and_the_field_table(in_dir):
    s = Settings(_env_file=None, MOONMIND_REPO="r")
    assert s.model_fields_set == {"repo", "moonmind_home", "owner_mode", "watch"}  # keyword, environment; no default
    copy = s.model_copy(update={"tenant": "acme", "gateway_tokens_file": "~/t.json"})
    assert (copy.repo, copy.tenant, s.tenant) == ("r", "acme", None)
    assert copy.model_fields_set == s.model_fields_set | {"tenant", "gateway_tokens_file"}
    assert copy.gateway_tokens_file == Path("~/t.json").expanduser()
    assert Settings.model_fields["collection"].aliases == ("MOONMIND_COLLECTION", "QDRANT_COLLECTION")
    assert Settings.model_fields["top_k"].default == 8
    assert Settings(_env_file=None) == Settings(_env_file=None) != s


def test_the_cli_reports_an_invalid_setting_with_its_exit_code(invoke):
    for extra, as_json in (([], False), (["--json"], True)):
        r = invoke("rag", "search", "-q", "x", *extra, extra_env={"RAG_SIMILARITY_TOP_K": "0"})
        assert r.code == EXIT_USAGE and r.stdout == "" and "Traceback" not in r.stderr
        if as_json:
            err = json.loads(r.stderr.strip().splitlines()[-1])["error"]
        else:
            assert r.stderr.startswith("error[invalid_setting]: ")
            err = {"code": "invalid_setting", "message": r.stderr.split(": ", 1)[1].split("\n")[0], "action": r.stderr}
        assert err["code"] == "invalid_setting"
        assert "RAG_SIMILARITY_TOP_K='0' (from the environment) must be an integer between 1 and 50" in err["message"]
        assert "Set RAG_SIMILARITY_TOP_K to an integer between 1 and 50, or unset it (default 8)." in err["action"]


@pytest.mark.slow
def test_search_path_imports_neither_pydantic_settings_nor_remote_clients(env, indexed):
    code = (
        "import sys; from moonmind_worker.cli.main import main; "
        "rc = main(['rag', 'search', '--query', 'bearer token', '--filters', 'repo=demo']); "
        "bad = [m for m in ('pydantic_settings', 'qdrant_client', 'openai', 'celery', 'fastapi') if m in sys.modules]; "
        "print('LOADED', bad, rc)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120).stdout
    assert "LOADED [] 0" in out
