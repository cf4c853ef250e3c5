"""What an index is built from (issue 53, item 1): a git commit, or files that are not a git checkout."""

from __future__ import annotations

import subprocess
from pathlib import Path

from moonmind_worker.indexing.source import describe, summary

GIT_ID = ["-c", "user.name=t", "-c", "user.email=t@example.com"]


def _git(tree: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(tree), *GIT_ID, *args], check=True, capture_output=True, text=True).stdout.strip()


def _repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    _git(root, "init", "-q", "-b", "main")
    (root / "app.py").write_text("x = 1\n")
    (root / ".gitignore").write_text("vendor/\n")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "first")
    return root


def test_a_tree_that_is_not_a_git_checkout_is_indexed_by_its_files_and_says_so(tmp_path):
    assert describe(tmp_path) == {"kind": "files"}
    assert summary(describe(tmp_path)) == "files (not a git checkout: content hashes)"


def test_a_checkout_names_its_commit_tree_branch_and_uncommitted_entries(tmp_path):
    root = _repo(tmp_path)
    (root / "new.py").write_text("y = 2\n")
    got = describe(root)
    assert got == {"kind": "git", "commit": _git(root, "rev-parse", "HEAD"), "tree": _git(root, "rev-parse", "HEAD^{tree}"),
                   "branch": "main", "uncommitted": 1, "toplevel": str(root.resolve())}
    assert summary(got) == f"main@{got['commit'][:12]} +1 uncommitted"


def test_a_detached_head_has_no_branch(tmp_path):
    root = _repo(tmp_path)
    _git(root, "checkout", "-q", "--detach")
    assert describe(root)["branch"] is None and summary(describe(root)).startswith("detached@")


def test_a_repository_without_a_commit_is_git_with_none_yet(tmp_path):
    _git(tmp_path, "init", "-q", "-b", "main")
    got = describe(tmp_path)
    assert (got["kind"], got["commit"], got["branch"]) == ("git", None, "main")


def test_a_tree_the_enclosing_checkout_ignores_is_files_not_that_checkouts_commit(tmp_path):
    root = _repo(tmp_path)
    (root / "vendor" / "lib").mkdir(parents=True)
    assert describe(root / "vendor" / "lib") == {"kind": "files"}
