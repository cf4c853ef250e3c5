"""Asking git about a tree: one place that runs it, with the environment that cannot point it elsewhere.

Read-only questions only (config, rev-parse, symbolic-ref, status). git's own safety applies: a repository
another user owns is refused by git (`safe.directory`), and the answer is then "unknown", never a
repository's config trusted to run a program.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

#: Environment variables that would point git at another repository than the tree's own.
_LOCATION = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_COMMON_DIR", "GIT_OBJECT_DIRECTORY")


def run(root: Path | str | None, *args: str, timeout_s: float = 10.0) -> subprocess.CompletedProcess[str] | None:
    """`git [-C root] ARGS`, its output as text; None when git is not installed or did not finish in time."""
    env = {k: v for k, v in os.environ.items() if k not in _LOCATION}
    where = ["-C", str(Path(root).absolute())] if root is not None else []  # run from /, so absolute
    try:
        return subprocess.run(["git", *where, *args], capture_output=True, text=True, timeout=timeout_s, env=env,
                              cwd="/", stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
