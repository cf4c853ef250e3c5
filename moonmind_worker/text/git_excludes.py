"""The ignore patterns git applies to every repository of a user: `core.excludesFile`.

Why: many people keep `.env`, `*.pem` and editor files out of every repository with it rather than
with each repository's `.gitignore`; `git status` shows them ignored, so the index must leave them out
too. git is asked for the setting (it knows every config file, `include`s and `~` expansion); its
default, `$XDG_CONFIG_HOME/git/ignore`, applies when it is unset or git is not installed.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from . import git

#: An excludes file larger than this is not read (real ones are a few KiB).
MAX_BYTES = 1 << 20


def lines(root: Path) -> list[str]:
    """The patterns of the excludes file git uses for the tree at `root` ([] when there is none)."""
    path = excludes_file(root)
    try:
        st = os.stat(path)
    except OSError:
        return []
    return list(_read(str(path), st.st_mtime_ns, st.st_size))


def excludes_file(root: Path) -> Path:
    """Where `core.excludesFile` points for `root`, or git's default (asked again only when a config file changed)."""
    return _asked(str(root), _config_key(root))


def _config_key(root: Path) -> tuple:
    """The config files that can set it, with their change times: a key that changes when the answer may."""
    home = Path(os.path.expanduser("~"))
    xdg = Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config")
    candidates = [home / ".gitconfig", xdg / "git" / "config", root / ".git" / "config", Path("/etc/gitconfig")]
    key: list[object] = [os.environ.get(k) for k in ("HOME", "XDG_CONFIG_HOME", "GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM")]
    for p in candidates:
        try:
            key.append(os.stat(p).st_mtime_ns)
        except OSError:
            key.append(None)
    return tuple(key)


@functools.lru_cache(maxsize=64)
def _asked(root: str, _key: tuple) -> Path:
    for where in (root, None):  # the tree's own config, then (a repository git refuses) the user's alone
        p = git.run(where, "config", "--path", "--get", "core.excludesFile")
        if p is None:
            break  # no git: its default below
        if p.returncode == 0 and p.stdout.strip():
            value = Path(p.stdout.strip())
            return value if value.is_absolute() else Path(root) / value
        if p.returncode == 1:  # unset
            break
    xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(xdg) / "git" / "ignore"


@functools.lru_cache(maxsize=16)
def _read(path: str, _mtime_ns: int, _size: int) -> tuple[str, ...]:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError:
        return ()
    if len(data) > MAX_BYTES:
        return ()
    return tuple(data.decode("utf-8", "replace").splitlines())
