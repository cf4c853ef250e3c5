"""`moonmind rag index --dry-run` (issue 38, item 4): what a run would index, how long, what it would cost.

The installed CLI as a subprocess on a fixture tree with files of each skip reason; the dry run's
counts are compared with a real index run's on the same tree.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from conftest import FIXTURE_FILES

#: The fixture tree plus one file of each reason a file is skipped.
SKIPS = {
    ".gitignore": "*.log\nbuild-cache/\n",
    "debug.log": "ignored by git's ignore rules (.gitignore, .git/info/exclude or core.excludesFile)\n",
    "empty.py": "\n\n",
    "lock/package-lock.json": "{}\n",
    "big.txt": "word " * 400,
}
#: small enough that big.txt is too large to index, large enough for every fixture file
MAX_FILE_BYTES = {"MOONMIND_MAX_FILE_BYTES": "1500"}


@pytest.fixture
def tree(repo: Path) -> Path:
    for rel, text in SKIPS.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    (repo / "blob.dat").write_bytes(b"\x00\x01bearer\x00")
    return repo


def snapshot(root: Path) -> dict[str, str]:
    """Every path under `root` and a hash of each file's bytes."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


@pytest.mark.slow
def test_a_dry_run_counts_exactly_what_a_real_run_then_indexes(cli, tree):
    dry = cli("rag", "index", str(tree), "--repo", "demo", "--dry-run", "--json", extra_env=MAX_FILE_BYTES)
    assert dry.code == 0, dry.stderr
    planned = dry.json()
    real = cli("rag", "index", str(tree), "--repo", "demo", "--json", extra_env=MAX_FILE_BYTES)
    assert real.code == 0, real.stderr
    done = real.json()
    assert planned["dry_run"] is True
    for key in ("files_seen", "files_indexed", "files_skipped", "skipped_by_reason", "dirs_skipped"):
        assert planned[key] == done[key], key
    assert planned["chunks"] == done["chunks_written"]
    assert {(s["path"], s["reason"]) for s in planned["skipped"]} == {(s["path"], s["reason"]) for s in done["skipped"]}
    assert {"binary", "no text to index"} <= set(planned["skipped_by_reason"])
    assert sum(v["files"] for v in planned["languages"].values()) == planned["files_indexed"]


@pytest.mark.slow
def test_a_dry_run_creates_no_home_opens_no_store_and_starts_no_owner(cli, tree, home):
    absent = home / "never-created"
    r = cli("rag", "index", str(tree), "--repo", "demo", "--dry-run",
            extra_env={"MOONMIND_HOME": str(absent), "MOONMIND_OWNER": "auto"})  # auto would start an owner if one were needed
    assert r.code == 0, r.stderr
    assert "dry run (nothing written)" in r.stdout and "chunks" in r.stdout
    assert not absent.exists()


@pytest.mark.slow
def test_a_dry_run_leaves_an_existing_index_byte_identical(cli, indexed, home):
    before = snapshot(home)
    r = cli("rag", "index", str(indexed), "--repo", "demo", "--tenant", "acme", "--dry-run", "--json")
    assert r.code == 0, r.stderr
    assert snapshot(home) == before


def test_the_hosted_cost_is_tokens_times_the_list_price_and_says_where_the_price_comes_from(repo):
    from moonmind_worker.indexing.dry_run import LIST_PRICES, dry_run
    from moonmind_worker.settings import Settings

    report = dry_run(repo, Settings(embedding_provider="openai"), repo="demo", tenant="t")
    cost = report["cost"]
    assert cost["model"] == "text-embedding-3-small" and cost["usd_per_million_tokens"] == LIST_PRICES["text-embedding-3-small"]
    assert cost["usd"] == round(cost["tokens"] * cost["usd_per_million_tokens"] / 1e6, 4) and "LIST_PRICES" in cost["price_source"]
    assert report["estimate"]["seconds"] is None and "not measured" in report["estimate"]["basis"]  # no billed sample


def test_the_price_setting_overrides_the_table_and_an_unknown_model_has_no_invented_price(repo):
    from moonmind_worker.indexing.dry_run import dry_run
    from moonmind_worker.settings import Settings

    priced = dry_run(repo, Settings(embedding_provider="openai", embedding_price_per_mtok=1.0), repo="d", tenant="t")["cost"]
    assert priced["usd_per_million_tokens"] == 1.0 and priced["price_source"] == "MOONMIND_EMBEDDING_PRICE_PER_MTOK"
    unknown = dry_run(repo, Settings(embedding_provider="openai", embedding_model="house-model"), repo="d", tenant="t")["cost"]
    assert unknown["usd"] is None and "MOONMIND_EMBEDDING_PRICE_PER_MTOK" in unknown["price_source"]


def test_a_local_models_time_is_estimated_from_a_measured_sample_and_costs_nothing(repo):
    from moonmind_worker.indexing.dry_run import dry_run
    from moonmind_worker.settings import Settings

    report = dry_run(repo, Settings(), repo="demo", tenant="t")
    assert report["chunks"] > 0 and report["files_indexed"] == len(FIXTURE_FILES)
    assert report["estimate"]["seconds"] is not None and report["estimate"]["embed_chunks_per_second"] > 0
    assert "measured" in report["estimate"]["basis"] and report["cost"]["usd"] == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("args, named", [
    (["/nonexistent/tree"], "is not a directory"),
    (["{tree}", "--execution", "queue"], "--dry-run reads the tree in this process"),
])
def test_a_dry_run_of_bad_input_exits_2_with_the_envelope(cli, tree, args, named):
    args = [a.format(tree=tree) for a in args]
    r = cli("rag", "index", *args, "--repo", "demo", "--dry-run", "--json")
    assert r.code == 2 and r.stdout == ""
    err = r.error()
    assert err["code"] == "invalid_argument" and named in err["message"] and err["action"]
    assert json.loads(r.stderr.strip().splitlines()[-1]).keys() == {"error"}
