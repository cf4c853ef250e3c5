"""`MOONMIND_EMBEDDING_PROVIDER=cohere`: the OpenAI adapter preset for Cohere's OpenAI-compatible endpoint.

Against a real HTTP server on loopback speaking the OpenAI embeddings protocol (tests/http_servers.py),
standing in for https://api.cohere.ai/compatibility/v1 through COHERE_BASE_URL. Its vectors are the
shipped static model's repeated 4 times: 1024 dimensions, the size of Cohere's embed-multilingual-v3.0.
"""

from __future__ import annotations

import pytest

from moonmind_worker.errors import MoonmindError
from moonmind_worker.settings import Settings

from http_servers import EmbeddingsServer

KEY = "co-test-5f1e0c2b9a7d4e3f"
MODEL = "embed-multilingual-v3.0"


def cohere_settings(**env) -> Settings:
    return Settings(_env_file=None, MOONMIND_EMBEDDING_PROVIDER="cohere", **env)


def test_the_cohere_preset_is_cohere_s_endpoint_model_and_key():
    from moonmind_worker.embedding import OpenAICompatibleEmbedder, make_embedder

    settings = cohere_settings(COHERE_API_KEY=KEY)
    embedder = make_embedder(settings)
    assert isinstance(embedder, OpenAICompatibleEmbedder) and embedder.provider == "cohere"
    assert embedder.name == settings.model_name == MODEL
    assert str(embedder._client.base_url) == "https://api.cohere.ai/compatibility/v1/"
    assert embedder._client.api_key == KEY
    assert KEY in settings.secrets()  # scrubbed from every message like the other keys


def test_the_preset_knows_its_models_size_without_asking_the_api(tmp_path):
    from moonmind_worker.embedding import make_embedder

    assert make_embedder(cohere_settings(COHERE_API_KEY=KEY, MOONMIND_HOME=str(tmp_path))).dimensions == 1024
    light = cohere_settings(COHERE_API_KEY=KEY, MOONMIND_HOME=str(tmp_path), MOONMIND_EMBEDDING_MODEL="embed-english-light-v3.0")
    assert make_embedder(light).dimensions == 384


def test_without_cohere_api_key_it_is_missing_credentials_naming_the_variable():
    from moonmind_worker.embedding import make_embedder

    with pytest.raises(MoonmindError) as err:
        make_embedder(cohere_settings(OPENAI_API_KEY="sk-not-for-cohere"))  # another provider's key is not used
    assert err.value.code == "missing_credentials" and "COHERE_API_KEY" in err.value.message


@pytest.fixture
def server():
    s = EmbeddingsServer(repeat=4, api_key=KEY)
    yield s
    s.close()


def cohere_env(server: EmbeddingsServer, key: str = KEY) -> dict[str, str]:
    return {"MOONMIND_EMBEDDING_PROVIDER": "cohere", "COHERE_API_KEY": key, "COHERE_BASE_URL": server.base_url}


@pytest.mark.slow
def test_index_and_search_through_the_cohere_preset(cli, repo, server):
    r = cli("rag", "index", str(repo), "--repo", "demo", "--json", extra_env=cohere_env(server))
    assert r.code == 0, r.stderr
    assert server.requests and all(q["model"] == MODEL and q["auth"] == f"Bearer {KEY}" for q in server.requests)
    assert "dimension probe" not in server.embedded_texts()  # the preset knew the size
    r = cli("rag", "search", "where are bearer tokens checked", "--filters", "repo=demo", "--json", extra_env=cohere_env(server))
    assert r.code == 0, r.stderr
    pack = r.json()
    assert pack["items"][0]["source"] == "auth/tokens.py"
    assert {i["model_version"] for i in pack["items"]} == {MODEL}
    assert server.embedded_texts()[-1] == "where are bearer tokens checked"
    assert KEY not in r.stdout + r.stderr


@pytest.mark.slow
def test_a_rejected_cohere_key_is_unauthenticated_and_the_key_is_never_printed(cli, repo, server):
    wrong = "co-wrong-8b3d1f0e6c2a4b7d"
    r = cli("rag", "index", str(repo), "--repo", "demo", extra_env=cohere_env(server, wrong))
    assert r.code == 4, (r.code, r.stderr)
    assert "error[unauthenticated]" in r.stderr
    assert "Check COHERE_API_KEY" in r.stderr and "OPENAI_API_KEY" not in r.stderr  # issue 57: the provider's own key
    assert wrong not in r.stdout + r.stderr and KEY not in r.stdout + r.stderr
