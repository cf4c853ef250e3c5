"""Which files of a tree are worth indexing.

Honours `.gitignore` files at every level (plus `.git/info/exclude`), and skips
what only adds noise or cost: binary files, files above the size cap, lock
files, vendored and generated directories.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Iterator

SKIP_DIRS = frozenset(
    """.git .hg .svn node_modules vendor third_party .venv venv env .env __pycache__ .mypy_cache .pytest_cache
    .ruff_cache .tox .nox build dist .next .nuxt target .idea .vscode site-packages .eggs .cache coverage
    htmlcov bower_components Pods .gradle .terraform""".split()
)
LOCK_FILES = frozenset(
    """package-lock.json yarn.lock pnpm-lock.yaml poetry.lock Pipfile.lock Cargo.lock composer.lock Gemfile.lock
    go.sum uv.lock pdm.lock mix.lock flake.lock""".split()
)
SKIP_SUFFIXES = (".min.js", ".min.css", ".map", ".lock", ".pyc", ".so", ".dll", ".dylib", ".class", ".jar",
                 ".png", ".jpg", ".jpeg", ".gif", ".ico", ".pdf", ".zip", ".gz", ".tar", ".whl", ".woff",
                 ".woff2", ".ttf", ".eot", ".mp4", ".mp3", ".sqlite", ".db", ".bin", ".pkl", ".npy", ".parquet")


@dataclass(frozen=True)
class Skipped:
    path: str
    reason: str


def is_binary(data: bytes) -> bool:
    """NUL in the first 8 KiB, or not decodable as UTF-8: not text we can cite."""
    head = data[:8192]
    if b"\x00" in head:
        return True
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start < len(head) - 4  # a multibyte char cut at the 8 KiB edge is fine
    return False


class Unreadable(Exception):
    """Why a file was not read: not a regular file, larger than allowed, or an OS error."""


def read_regular(path: str | Path, max_bytes: int) -> tuple[bytes, os.stat_result]:
    """The bytes of a regular file (and its stat), never more than `max_bytes`.

    Why every reader of a path goes through here: opening a FIFO blocks forever, and a device
    such as /dev/zero reports size 0 while its data never ends. The file is opened non-blocking
    and checked on its open descriptor, so what is checked is what is read. FileNotFoundError
    passes through (callers name the missing file their own way); anything else is `Unreadable`.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise Unreadable(f"unreadable ({exc.strerror or type(exc).__name__})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Unreadable("not a regular file")
        if st.st_size > max_bytes:
            raise Unreadable(f"larger than {max_bytes} bytes")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise Unreadable(f"unreadable ({exc.strerror or type(exc).__name__})") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:  # it grew since the check
        raise Unreadable(f"larger than {max_bytes} bytes")
    return data, st


def read_text(path: Path, max_bytes: int) -> tuple[str | None, str | None]:
    """(text, None) or (None, reason it was skipped): a regular, non-binary file (see read_regular)."""
    try:
        data, _ = read_regular(path, max_bytes)
    except FileNotFoundError as exc:
        return None, f"unreadable ({exc.strerror or type(exc).__name__})"
    except Unreadable as exc:
        return None, str(exc)
    if is_binary(data):
        return None, "binary"
    return data.decode("utf-8", errors="replace"), None


def name_problem(name: str) -> str | None:
    """Why a file or directory name cannot be stored as a path, or None.

    A name that is not valid UTF-8 reaches Python with lone surrogates (PEP 383), which
    neither the tokenizer nor a JSON payload can carry; such a file is skipped, not fatal.
    """
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "its name is not valid UTF-8 (rename it to index it)"
    return None


#: A .gitignore larger than this is not read (real ones are a few KiB).
IGNORE_FILE_MAX_BYTES = 1 << 20


def _gitignore(dirpath: Path, rel: str):
    import pathspec

    patterns: list[str] = []
    for name in (".gitignore",) + ((".git/info/exclude",) if not rel else ()):
        f = dirpath / name
        if f.is_file():
            try:
                patterns.extend(read_regular(f, IGNORE_FILE_MAX_BYTES)[0].decode("utf-8", "replace").splitlines())
            except (OSError, Unreadable):
                pass
    if not patterns:
        return None
    return pathspec.GitIgnoreSpec.from_lines(patterns)  # git's own rules (the "gitwildmatch" name is deprecated)


def walk(root: Path, skipped: list[Skipped] | None = None) -> Iterator[tuple[str, Path]]:
    """Yield (repo-relative POSIX path, absolute path) of candidate files, sorted, deterministic."""
    root = root.resolve()
    specs: list[tuple[str, object]] = []  # (base rel dir, spec) stack

    def ignored(rel: str, is_dir: bool) -> bool:
        return _ignored_by(specs, rel, is_dir)

    def visit(dirpath: Path, rel: str) -> Iterator[tuple[str, Path]]:
        spec = _gitignore(dirpath, rel)
        if spec is not None:
            specs.append((rel, spec))
        try:
            entries = sorted(os.scandir(dirpath), key=lambda e: e.name)
        except OSError:
            entries = []
        for e in entries:
            child = f"{rel}/{e.name}" if rel else e.name
            if e.is_symlink():
                # never follow links: they can leave the tree or loop
                continue
            problem = name_problem(e.name)
            if problem is not None:
                if skipped is not None:
                    shown = child.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
                    skipped.append(Skipped(shown, problem))
                continue
            if e.is_dir():
                if e.name in SKIP_DIRS or e.name.endswith(".egg-info") or ignored(child, True):
                    continue
                yield from visit(Path(e.path), child)
            elif e.is_file():
                if ignored(child, False):
                    continue
                if e.name in LOCK_FILES or e.name.endswith(SKIP_SUFFIXES):
                    if skipped is not None:
                        skipped.append(Skipped(child, "lock/vendored/binary type"))
                    continue
                yield child, Path(e.path)
        if spec is not None:
            specs.pop()

    yield from visit(root, "")


def excluded_reason(root: Path, rel: str) -> str | None:
    """Why `walk(root)` would leave out the file `rel` (None when it would index it).

    The same rules as the walk, for one path: so a file a worker names
    explicitly (a workspace overlay) is held to what the canonical index holds.
    """
    parts = PurePosixPath(rel).parts
    for d in parts[:-1]:
        if d in SKIP_DIRS or d.endswith(".egg-info"):
            return f"inside a skipped directory ({d}/)"
    name = parts[-1]
    if name in LOCK_FILES or name.endswith(SKIP_SUFFIXES):
        return "lock/vendored/binary type"
    specs: list[tuple[str, object]] = []
    for i in range(len(parts)):
        base = "/".join(parts[:i])
        spec = _gitignore(root / base if base else root, base)
        if spec is not None:
            specs.append((base, spec))
        if _ignored_by(specs, "/".join(parts[: i + 1]), i < len(parts) - 1):
            return "ignored by .gitignore"
    return None


def _ignored_by(specs: list[tuple[str, object]], rel: str, is_dir: bool) -> bool:
    """git's rule: the deepest .gitignore with a pattern matching `rel` decides, so a nested
    `!*.log` re-includes what the root's `*.log` excluded (within that file, the last match wins)."""
    for base, spec in reversed(specs):
        if base and not rel.startswith(base + "/"):
            continue
        sub = rel[len(base) + 1 :] if base else rel
        include = spec.check_file(sub + ("/" if is_dir else "")).include  # type: ignore[attr-defined]
        if include is not None:
            return include
    return False
