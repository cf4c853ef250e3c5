"""`moonmind rag search` through the CLI, in process (tests/cli_runner.py): spec 05's acceptance scenarios and
bad inputs; the installed console script's lean import path is checked in a subprocess.

One fixture index (built once for the module) serves every read-only search here,
so the suite stays fast; each test is one behaviour.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from cli_runner import CliRunner
from conftest import _SCRUB, FIXTURE_FILES, MOONMIND, Result, write_tree

#: FR-007's fields under this project's names (README "Contracts": source_file→source,
#: content→text, processing_timestamp→indexed_at, similarity_score→score).
FR007_FIELDS = (
    "chunk_id", "source", "section_title", "text", "content_hash", "chunk_sequence", "total_chunks",
    "indexed_at", "token_count", "model_version", "score",
)

LONG_FUNCTION = "def render_invoice_table(rows):\n    \"\"\"Render invoice rows as an aligned text table.\"\"\"\n" + "".join(
    f"    line_{i} = format_invoice_cell(rows[{i}], width={i + 10})  # column {i}\n" for i in range(18)
) + "    return '\\n'.join([line_0, line_1])\n"

#: The same block twice in one file: two chunks with one chunk_hash at one path.
DUPLICATED = "\n".join(
    textwrap.dedent(
        f'''
        def retry_policy_{n}():
            """Retry with exponential backoff and jitter."""
            return backoff_with_jitter(base=0.2, cap=4.0)
        '''
    )
    for n in range(6)
)


@pytest.fixture(scope="module")
def searcher(tmp_path_factory):
    """Index the fixture repo (plus a long-chunk file) once as repo=demo tenant=acme; return a runner."""
    base = tmp_path_factory.mktemp("search_cli")
    files = dict(FIXTURE_FILES)
    files["billing/invoice.py"] = LONG_FUNCTION
    root = write_tree(base / "repo", files)
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    env["MOONMIND_HOME"] = str(base / "home")
    runner = CliRunner(env, base)  # in process: what a console script adds is checked by the one-shot test below
    r = runner.invoke("rag", "index", str(root), "--repo", "demo", "--tenant", "acme")
    assert r.code == 0, r.stderr

    def run(*args: str) -> Result:
        return runner.invoke("rag", "search", *args)

    run.root = root
    run.env = env
    run.cwd = base
    return run


def _pack(r: Result) -> dict:
    assert r.code == 0, r.stderr
    assert "Traceback" not in r.stderr
    return r.json()


def _assert_usage_error(r: Result, code: str = "invalid_query") -> dict:
    assert r.code == 2, (r.code, r.stderr)
    assert r.stdout == ""
    assert "Traceback" not in r.stderr
    err = r.error()
    assert err["code"] == code and err["message"] and err["action"]
    return err


@pytest.mark.slow
def test_every_fr007_field_is_present_on_every_item(searcher):
    pack = _pack(searcher("--query", "bearer token check", "--filters", "repo=demo", "--json"))
    assert pack["items"]
    for item in pack["items"]:
        missing = [f for f in FR007_FIELDS if f not in item]
        assert not missing, missing
        assert item["chunk_id"] and item["content_hash"].startswith("sha256:") and item["model_version"]
        assert 0 <= item["chunk_sequence"] < item["total_chunks"]
        assert item["token_count"] > 0 and item["indexed_at"].endswith("Z")


@pytest.mark.slow
def test_long_chunk_text_is_returned_whole(searcher):
    pack = _pack(searcher("--query", "render invoice table rows", "--filters", "repo=demo", "--json"))
    item = next(i for i in pack["items"] if i["source"] == "billing/invoice.py")
    source = (searcher.root / "billing/invoice.py").read_text()
    assert len(item["text"]) > 1000
    assert item["text"] == source[item["offset_start"] : item["offset_end"]] == source
    assert item["text"].rstrip("\n") in pack["context_text"]


@pytest.mark.slow
def test_results_are_ordered_by_score(searcher):
    items = _pack(searcher("--query", "connection pool", "--filters", "repo=demo", "--json"))["items"]
    scores = [i["score"] for i in items]
    assert scores == sorted(scores, reverse=True)
    assert items[0]["source"] == "db/pool.py"


@pytest.mark.slow
@pytest.mark.parametrize("k", ["1", "3"])
def test_top_k_is_respected(searcher, k):
    pack = _pack(searcher("--query", "python", "--filters", "repo=demo", "--top-k", k, "--score-threshold", "0", "--json"))
    assert len(pack["items"]) == int(k) and pack["top_k"] == int(k)


@pytest.mark.slow
def test_top_k_is_filled_after_dedupe(tmp_path, env, cli):
    """Identical chunks at one path collapse to one item, and top_k is still met from the rest."""
    root = write_tree(tmp_path / "dup", {**FIXTURE_FILES, "retry/policy.py": DUPLICATED + "\n" + DUPLICATED})
    assert cli("rag", "index", str(root), "--repo", "dup", "--tenant", "acme").code == 0
    pack = _pack(cli("rag", "search", "--query", "retry backoff jitter", "--filters", "repo=dup", "--top-k", "5",
                     "--score-threshold", "0", "--json"))
    keys = [(i["source"], i["chunk_hash"]) for i in pack["items"]]
    assert len(keys) == 5 and len(set(keys)) == 5


@pytest.mark.slow
def test_score_threshold_is_respected(searcher):
    everything = _pack(searcher("--query", "bearer token", "--filters", "repo=demo", "--score-threshold", "0", "--json"))
    scores = sorted(i["score"] for i in everything["items"])
    cut = scores[len(scores) // 2]
    pack = _pack(searcher("--query", "bearer token", "--filters", "repo=demo", "--score-threshold", str(cut), "--json"))
    assert pack["score_threshold"] == cut
    assert pack["items"] and all(i["score"] >= cut for i in pack["items"])
    assert len(pack["items"]) < len(everything["items"])


@pytest.mark.slow
def test_zero_hits_is_success_with_best_score_and_how_to_lower(searcher):
    r = searcher("--query", "bearer token", "--filters", "repo=demo", "--score-threshold", "0.99", "--json")
    pack = _pack(r)
    assert pack["items"] == []
    best = pack["best_score"]
    assert 0 < best < 0.99
    assert f"{best:.3f}" in r.stderr and "--score-threshold" in r.stderr
    assert "_No matching context._" in pack["context_text"]


@pytest.mark.slow
def test_filter_that_matches_nothing_says_so(searcher):
    r = searcher("--query", "bearer token", "--filters", "repo=nope")
    assert r.code == 0, r.stderr
    assert "no chunks match these filters" in r.stderr


@pytest.mark.slow
def test_path_and_language_filters_narrow_results(searcher):
    items = _pack(searcher("--query", "token", "--filters", "repo=demo", "path=db/pool.py", "--score-threshold", "0", "--json"))["items"]
    assert items and {i["source"] for i in items} == {"db/pool.py"}
    items = _pack(searcher("--query", "token", "--filters", "repo=demo", "language=markdown", "--score-threshold", "0", "--json"))["items"]
    assert items and {i["source"] for i in items} == {"docs/guide.md"}


@pytest.mark.slow
def test_repo_flag_is_the_repo_filter_and_a_disagreeing_pair_is_refused(searcher):
    as_flag = _pack(searcher("bearer token", "--repo", "demo", "--score-threshold", "0", "--json"))
    as_filter = _pack(searcher("bearer token", "--filters", "repo=demo", "--score-threshold", "0", "--json"))
    assert as_flag["items"] and [i["source"] for i in as_flag["items"]] == [i["source"] for i in as_filter["items"]]
    assert as_flag["filters"] == as_filter["filters"]
    err = _assert_usage_error(searcher("bearer token", "--repo", "demo", "--filters", "repo=other", "--json"))
    assert "--repo" in err["message"] and "disagree" in err["message"]


def test_empty_query_is_refused(searcher):
    err = _assert_usage_error(searcher("--query", "", "--json"))
    assert "empty" in err["message"]


@pytest.mark.slow
def test_whitespace_query_is_refused(searcher):
    err = _assert_usage_error(searcher("--query", " \t\n ", "--json"))
    assert "empty" in err["message"]


@pytest.mark.slow
@pytest.mark.parametrize("k", ["0", "51", "-3"])
def test_top_k_outside_1_to_50_is_refused(searcher, k):
    err = _assert_usage_error(searcher("--query", "token", "--top-k", k, "--json"))
    assert "between 1 and 50" in err["message"]


def test_non_integer_top_k_is_refused(searcher):
    err = _assert_usage_error(searcher("--query", "token", "--top-k", "many", "--json"), "invalid_argument")
    assert "--top-k" in err["message"]


@pytest.mark.parametrize("pair", ["repo", "=demo", "repo:demo"])
def test_malformed_filter_is_refused(searcher, pair):
    err = _assert_usage_error(searcher("--query", "token", "--filters", pair, "--json"))
    assert "KEY=VALUE" in err["message"] or "key=value" in err["action"]


def test_unknown_filter_key_is_refused_naming_the_known_keys(searcher):
    err = _assert_usage_error(searcher("--query", "token", "--filters", "colour=blue", "--json"))
    assert "colour" in err["message"] and "repo" in err["message"]


def test_usage_error_without_json_is_readable_text(searcher):
    r = searcher("--query", "token", "--filters", "colour=blue")
    assert r.code == 2 and r.stdout == ""
    assert r.stderr.startswith("error[invalid_query]:") and "action:" in r.stderr


def test_out_of_range_threshold_is_refused(searcher):
    _assert_usage_error(searcher("--query", "token", "--score-threshold", "1.5", "--json"))


def test_very_long_query_is_processed_with_a_note(searcher):
    query = " ".join(["where are bearer tokens checked"] * 100)  # ~3,100 characters
    r = searcher("--query", query, "--filters", "repo=demo", "--json")
    pack = _pack(r)
    assert "query truncated" in r.stderr
    assert len(pack["query"]) < len(query)
    assert pack["items"][0]["source"] == "auth/tokens.py"


@pytest.mark.slow
def test_query_just_over_1000_characters_is_processed_whole(searcher):
    query = ("bearer token " * 80).strip()  # 1,039 characters
    r = searcher("--query", query, "--filters", "repo=demo", "--json")
    pack = _pack(r)
    assert pack["query"] == query and "truncated" not in r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("query", ["!@#$%^&*()", "%%% ??? ***", "12345 67890", "🙂🙂🙂"])
def test_special_characters_only_query_is_searched_normally(searcher, query):
    r = searcher("--query", query, "--filters", "repo=demo", "--json")
    pack = _pack(r)
    assert pack["query"] == query
    assert pack["context_text"].startswith("### Retrieved Context")
    if not pack["items"]:
        assert "note:" in r.stderr


@pytest.mark.slow
def test_same_query_twice_gives_identical_output(searcher):
    a = searcher("--query", "cache redis ttl", "--filters", "repo=demo")
    b = searcher("--query", "cache redis ttl", "--filters", "repo=demo")
    assert a.code == 0 and a.stdout == b.stdout
    assert "docs/guide.md" in a.stdout


@pytest.mark.slow
def test_a_one_shot_ascii_search_loads_no_numpy_and_prints_what_the_numpy_path_prints(searcher):
    args = ("rag", "search", "--query", "cache redis ttl", "--filters", "repo=demo")
    lean = subprocess.run([MOONMIND, *args], env=dict(searcher.env, PYTHONPROFILEIMPORTTIME="1"), cwd=searcher.cwd,
                          capture_output=True, text=True, timeout=120)
    imported = {line.split("|")[-1].strip().split(".")[0] for line in lean.stderr.splitlines() if line.startswith("import time:")}
    assert "moonmind_worker" in imported, "import profile missing"
    assert not imported & {"numpy", "tokenizers", "safetensors"}
    with_numpy = "import sys, numpy; from moonmind_worker.cli.main import main; sys.exit(main(sys.argv[1:]))"
    full = subprocess.run([sys.executable, "-c", with_numpy, *args], env=searcher.env, cwd=searcher.cwd,
                          capture_output=True, text=True, timeout=120)
    assert lean.returncode == full.returncode == 0, full.stderr
    assert lean.stdout == full.stdout and "docs/guide.md" in lean.stdout
