"""What a repository's canonical index was built from: a git commit, or files that are not a git checkout.

Why: worktrees, branches and jobs of one repository should share one base and differ only by overlays
(issue 53). That starts with the base knowing its commit: `rag index` records it per (tenant, repo),
and `rag repos` and `rag stats` show it. A tree that is not a git checkout is indexed by its files'
content hashes, as always, and says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..text import git

#: The kind of a source that is not a git checkout (or whose repository git would not read).
FILES = "files"


def describe(root: Path) -> dict[str, Any]:
    """The source of an index of `root`: {"kind": "git", "commit", "tree", "branch", "uncommitted", "toplevel"}
    or {"kind": "files"}. `commit` is None in a repository without one; `branch` None on a detached HEAD;
    `uncommitted`: entries `git status` lists under `root` (changed, staged, untracked, not ignored)."""
    top = git.run(root, "rev-parse", "--show-toplevel")
    if top is None or top.returncode != 0 or not top.stdout.strip():
        return {"kind": FILES}
    if Path(top.stdout.strip()) != root.resolve():  # a tree inside a checkout that ignores it is no commit's
        ignored = git.run(root, "check-ignore", "-q", str(root.resolve()))
        if ignored is not None and ignored.returncode == 0:
            return {"kind": FILES}
    head = git.run(root, "rev-parse", "-q", "HEAD", "HEAD^{tree}")
    commit, tree = (head.stdout.split() + [None, None])[:2] if head is not None and head.returncode == 0 else (None, None)
    branch = git.run(root, "symbolic-ref", "--short", "-q", "HEAD")
    status = git.run(root, "status", "--porcelain", "--untracked-files=normal", "--", ".")
    return {
        "kind": "git", "commit": commit, "tree": tree, "toplevel": top.stdout.strip(),
        "branch": branch.stdout.strip() or None if branch is not None and branch.returncode == 0 else None,
        "uncommitted": len(status.stdout.splitlines()) if status is not None and status.returncode == 0 else None,
    }


def summary(source: dict[str, Any] | None) -> str:
    """One line for a table: `main@1a2b3c4d`, `main@1a2b3c4d +3 uncommitted`, `files (not a git checkout)`."""
    if not source:
        return "unknown (indexed before sources were recorded)"
    if source.get("kind") != "git":
        return "files (not a git checkout: content hashes)"
    where = f"{source.get('branch') or 'detached'}@{(source.get('commit') or 'no commit')[:12]}"
    changed = source.get("uncommitted")
    return where + (f" +{changed} uncommitted" if changed else "")
