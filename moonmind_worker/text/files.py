"""Which files of a tree are worth indexing.

Honours `.gitignore` files at every level (plus `.git/info/exclude`), and skips
what only adds noise or cost: binary files, files above the size cap, lock
files, vendored and generated directories.
"""

from __future__ import annotations

import errno
import functools
import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Iterable, Iterator, Literal, Sequence

from . import git_excludes
from .secrets import secret_file, secret_file_reason

SKIP_DIRS = frozenset(
    """.git .hg .svn node_modules vendor third_party .venv venv env .env __pycache__ .mypy_cache .pytest_cache
    .ruff_cache .tox .nox build dist .next .nuxt target .idea .vscode site-packages .eggs .cache coverage
    htmlcov bower_components Pods .gradle .terraform""".split()
)
LOCK_FILES = frozenset(
    """package-lock.json yarn.lock pnpm-lock.yaml poetry.lock Pipfile.lock Cargo.lock composer.lock Gemfile.lock
    go.sum uv.lock pdm.lock mix.lock flake.lock""".split()
)
#: Types that are never text (or only generated text), skipped by name, unread. `.mo`: gettext's compiled
#: catalogs, binary, beside the `.po` they are built from (1,261 in Django: read and found binary on every run,
#: and their size alone started a no-change run's worker processes, see indexing.workers.Pool.expect).
SKIP_SUFFIXES = (".min.js", ".min.css", ".map", ".lock", ".pyc", ".so", ".dll", ".dylib", ".class", ".jar",
                 ".png", ".jpg", ".jpeg", ".gif", ".ico", ".pdf", ".zip", ".gz", ".tar", ".whl", ".woff",
                 ".woff2", ".ttf", ".eot", ".mp4", ".mp3", ".sqlite", ".db", ".bin", ".pkl", ".npy", ".parquet", ".mo")
#: Why a file of those types (or a lock file) is skipped.
SKIPPED_TYPE = "lock/vendored/binary type"
#: gettext catalogs: every locale's copy of the messages the code and its templates hold. Skipped unless a
#: run asks for them (MOONMIND_INDEX_CATALOGS=on). Why: a search for a message then finds the catalogs, not
#: the code that says it (on Django they held ~5 of every 10 results of such a search, and 20% of its
#: chunks); figures: BENCHMARKS.md ("Translation catalogs").
CATALOG_SUFFIXES = (".po", ".pot")
SKIPPED_CATALOG = "gettext catalog (MOONMIND_INDEX_CATALOGS=on indexes them)"


def skipped_type(name: str, catalogs: bool = False) -> str | None:
    """Why a file named `name` is skipped by its type alone (None: it is not); `catalogs`: index gettext catalogs."""
    if name in LOCK_FILES or name.endswith(SKIP_SUFFIXES):
        return SKIPPED_TYPE
    if not catalogs and name.endswith(CATALOG_SUFFIXES):
        return SKIPPED_CATALOG
    return None


@dataclass(frozen=True)
class WalkRules:
    """What the walk leaves out beyond ignore rules and skipped directories: the parts a setting changes."""

    #: index gettext catalogs (MOONMIND_INDEX_CATALOGS=on)
    catalogs: bool = False
    #: index secret files such as `.env` and `id_rsa` (MOONMIND_INDEX_SECRET_FILES=on; see text.secrets)
    secret_files: bool = False

    @classmethod
    def of(cls, settings: Any) -> WalkRules:
        return cls(catalogs=settings.index_catalogs == "on", secret_files=settings.index_secret_files == "on")


def skipped_file(rel: str, rules: WalkRules) -> str | None:
    """Why the file at `rel` is skipped by its name alone (its type, a catalog, a secret file), or None."""
    why = skipped_type(rel.rpartition("/")[2], rules.catalogs)
    if why is None and not rules.secret_files:
        kind = secret_file(rel)
        if kind is not None:
            return secret_file_reason(kind)
    return why


@dataclass(frozen=True)
class Skipped:
    path: str
    reason: str
    #: "file": a file of the tree, counted in an index run's files_seen; "directory": one not walked
    #: into; "ignore rule": a pattern of an ignore file that was not applied
    kind: str = "file"


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


#: Why a link met where a tree's file or directory was listed is not read.
LINK_NOT_FOLLOWED = "a symbolic link (links inside an indexed tree are never followed)"


def read_regular(path: str | Path, max_bytes: int, *, dir_fd: int | None = None) -> tuple[bytes, os.stat_result]:
    """The bytes of a regular file (and its stat), never more than `max_bytes`.

    Why every reader of a path goes through here: opening a FIFO blocks forever, and a device
    such as /dev/zero reports size 0 while its data never ends. The file is opened non-blocking
    and checked on its open descriptor, so what is checked is what is read. FileNotFoundError
    passes through (callers name the missing file their own way); anything else is `Unreadable`.
    With `dir_fd`, `path` is a name in that directory and a link there is not followed (`TreeReader`).
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
    if dir_fd is not None:
        flags |= os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if dir_fd is not None and exc.errno == errno.ELOOP:
            raise Unreadable(LINK_NOT_FOLLOWED) from None
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
    return _text_of(data)


def _text_of(data: bytes) -> tuple[str | None, str | None]:
    if is_binary(data):
        return None, "binary"
    return data.decode("utf-8", errors="replace"), None


class TreeReader:
    """Reads a tree's files by their path under its root, never through a link.

    Why: a tree can change while it is indexed, and a file listed as regular but swapped for a
    link (to /etc/shadow, say) before it is read must not be read. Each directory on the way is
    opened relative to its parent and the file relative to its directory, all with O_NOFOLLOW, so
    whatever is read is inside the root. The directories of the last path stay open: files read
    in walk order open each directory once.
    """

    def __init__(self, root: Path) -> None:
        self._root = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # the root the caller named
        self._open: list[tuple[str, int]] = []

    def __enter__(self) -> TreeReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for _, fd in reversed(self._open):
            os.close(fd)
        self._open.clear()
        if self._root >= 0:
            os.close(self._root)
            self._root = -1

    def _directory(self, parts: Sequence[str]) -> int:
        keep = 0
        while keep < min(len(parts), len(self._open)) and self._open[keep][0] == parts[keep]:
            keep += 1
        for _, fd in reversed(self._open[keep:]):
            os.close(fd)
        del self._open[keep:]
        for name in parts[keep:]:
            fd = os.open(name, _DIR_FLAGS, dir_fd=self._open[-1][1] if self._open else self._root)
            self._open.append((name, fd))
        return self._open[-1][1] if self._open else self._root

    def read_text(self, rel: str, max_bytes: int) -> tuple[str | None, str | None]:
        """(text, None) or (None, reason it was skipped), as `read_text` for the file `rel`."""
        text, reason, _ = self.read(rel, max_bytes)
        return text, reason

    def read(self, rel: str, max_bytes: int) -> tuple[str | None, str | None, os.stat_result | None]:
        """`read_text`, and the stat of what was read (taken on the open file, before reading it)."""
        *dirs, name = rel.split("/")
        try:
            data, st = read_regular(name, max_bytes, dir_fd=self._directory(dirs))
        except OSError as exc:  # a directory on the way, or a missing file
            if exc.errno == errno.ELOOP:
                return None, "a directory on its path is " + LINK_NOT_FOLLOWED, None
            return None, f"unreadable ({exc.strerror or type(exc).__name__})", None
        except Unreadable as exc:
            return None, str(exc), None
        return (*_text_of(data), st)

    def stat(self, rel: str) -> os.stat_result | None:
        """The file `rel`'s own stat (a link is not followed), or None when it cannot be had."""
        *dirs, name = rel.split("/")
        try:
            return os.stat(name, dir_fd=self._directory(dirs), follow_symlinks=False)
        except OSError:
            return None


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
#: Directory levels the walk descends (the root's own entries are level 1): a deeper directory is
#: skipped with a note, so one absurdly deep branch never costs the rest of the tree.
MAX_DEPTH = 256
#: Limits on one ignore pattern; a pattern over them is not applied, with a note naming it.
#: Why: every name in the tree is matched against every pattern, so what one pattern may cost
#: bounds the walk. A `*` within a name is matched in linear time (`_linear_segment`) but still
#: scans the name once; each `**` spanning directories multiplies a match by the path's depth.
MAX_PATTERN_STARS = 8
MAX_PATTERN_GLOBSTARS = 2
MAX_PATTERN_CHARS = 4096

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_STAR = "[^/]*"  # what pathspec makes of a `*` within a name
_GLOBSTARS = ("(?:.+/)?", "(?:/.+)?")  # ... and of a `**` that spans directories


def _linear_segment(regex: str) -> str:
    """A name glob's regex (pathspec's, for one path segment) that cannot backtrack catastrophically.

    Why: Python's `re` backtracks, so `a*a*a*…c` against a long name tries every way to split
    the name, exponentially many. The pieces between stars match fixed lengths, so a middle piece
    taken at its leftmost place is always a right choice (the stars after it absorb the rest):
    each is found lazily and kept (an atomic group); the segment, which always ends at the next
    `/` or the end, is kept whole. A run of stars is one star (`a**b` is `a*b` to git).
    """
    pieces = regex.split(_STAR)
    if len(pieces) < 3:  # at most one star: it backtracks over the name once
        return regex
    first, *middle, last = pieces
    middle = [m for m in middle if m]
    if not middle:
        return first + _STAR + last
    return "(?>" + first + "".join(f"(?>[^/]*?{m})" for m in middle) + _STAR + last + "(?=/|$))"


@functools.cache
def _pattern_class() -> type:
    from pathspec.patterns.gitignore.spec import GitIgnoreSpecPattern

    class BoundedPattern(GitIgnoreSpecPattern):
        """git's rules as pathspec compiles them, each name glob matched in linear time."""

        @staticmethod
        def _translate_segment_glob(pattern: str, range_error: Literal["literal", "raise"]) -> str:
            return _linear_segment(GitIgnoreSpecPattern._translate_segment_glob(pattern, range_error))

    return BoundedPattern


def _patterns(lines: list[str], source: str, skipped: list[Skipped] | None) -> list:
    """The compiled patterns of one ignore file; one that is invalid or too costly is left out with a note."""
    factory = _pattern_class()
    out = []
    for line in lines:
        if not line:
            continue
        why = None
        if len(line) > MAX_PATTERN_CHARS:
            why = f"longer than {MAX_PATTERN_CHARS} characters"
        else:
            try:
                pattern = factory(line)
            except ValueError:  # pathspec's GitIgnorePatternError (a trailing backslash, ...)
                why = "not a valid pattern"
            else:
                regex = pattern.regex.pattern if pattern.regex is not None else ""
                if regex.count(_STAR) > MAX_PATTERN_STARS:
                    why = f"more than {MAX_PATTERN_STARS} '*' wildcards, too costly to match against every name"
                elif sum(map(regex.count, _GLOBSTARS)) > MAX_PATTERN_GLOBSTARS:
                    why = f"more than {MAX_PATTERN_GLOBSTARS} '**' spanning directories, too costly to match"
        if why is None:
            out.append(pattern)
        elif skipped is not None:
            shown = line if len(line) <= 120 else line[:120] + "…"
            skipped.append(Skipped(source, f"ignore pattern {shown!r} not applied: {why}", "ignore rule"))
    return out


def _read_beneath(dir_fd: int, rel: str, max_bytes: int) -> bytes:
    """A file under the directory `dir_fd`, every step without following a link (see read_regular)."""
    *dirs, name = rel.split("/")
    fds: list[int] = []
    try:
        for d in dirs:
            fds.append(os.open(d, _DIR_FLAGS, dir_fd=fds[-1] if fds else dir_fd))
        return read_regular(name, max_bytes, dir_fd=fds[-1] if fds else dir_fd)[0]
    finally:
        for fd in fds:
            os.close(fd)


def _gitignore(dir_fd: int, rel: str, skipped: list[Skipped] | None = None, excludes: Sequence[str] = ()):
    """The ignore rules of one directory (`.gitignore`; at the root also `.git/info/exclude` and the user's
    `excludes`, core.excludesFile's lines), or None.

    Read relative to the directory's descriptor without following links, as git does (2.32+): a
    `.gitignore` that is a link is not applied. In git's order of precedence: the last pattern that
    matches decides, so the user's excludes come first and the tree's own `.gitignore` last.
    """
    patterns: list = _patterns(list(excludes), "core.excludesFile", skipped) if not rel else []
    for name in ((".git/info/exclude",) if not rel else ()) + (".gitignore",):
        source = f"{rel}/{name}" if rel else name
        try:
            data = _read_beneath(dir_fd, name, IGNORE_FILE_MAX_BYTES)
        except Unreadable as exc:
            if str(exc) == LINK_NOT_FOLLOWED and skipped is not None:
                skipped.append(Skipped(source, LINK_NOT_FOLLOWED + ": its patterns are not applied", "ignore rule"))
            continue
        except OSError:
            continue
        patterns.extend(_patterns(data.decode("utf-8", "replace").splitlines(), source, skipped))
    if not patterns:
        return None
    from pathspec import GitIgnoreSpec

    return GitIgnoreSpec(patterns)  # git's own rules (the "gitwildmatch" name is deprecated)


def walk(root: Path, skipped: list[Skipped] | None = None, *, rules: WalkRules = WalkRules()) -> Iterator[tuple[str, Path]]:
    """Yield (repo-relative POSIX path, absolute path) of candidate files, sorted, deterministic; what
    `rules` leaves out is noted in `skipped`.

    Depth first in name order (a directory's files come where its name sorts), without recursion:
    each directory is opened relative to its parent, never through a link. A directory that cannot
    be listed, or is deeper than MAX_DEPTH, is skipped with a note; the rest of the tree is walked.
    """
    root = root.resolve()
    specs: list[tuple[str, object]] = []  # (base rel dir, spec) stack
    stack: list[tuple[int, str, Iterator[os.DirEntry[str]], bool]] = []  # (fd, rel, entries left, has a spec)
    try:
        _enter(os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), "", stack, specs, skipped,  # the root the caller named
               git_excludes.lines(root))
    except OSError as exc:
        _note(skipped, ".", f"unreadable directory ({exc.strerror or type(exc).__name__})", "directory")
    try:
        while stack:
            fd, rel, entries, has_spec = stack[-1]
            e = next(entries, None)
            if e is None:
                stack.pop()
                os.close(fd)
                if has_spec:
                    specs.pop()
                continue
            child = f"{rel}/{e.name}" if rel else e.name
            try:
                if e.is_symlink():
                    # never follow links: they can leave the tree or loop
                    continue
                is_dir = e.is_dir()
                is_file = not is_dir and e.is_file()
            except OSError as exc:
                _note(skipped, _shown(child), f"unreadable ({exc.strerror or type(exc).__name__})")
                continue
            problem = name_problem(e.name)
            if problem is not None:
                _note(skipped, _shown(child), problem, "directory" if is_dir else "file")
                continue
            if is_dir:
                sub = _open_subdir(fd, e.name, child, len(stack), specs, skipped)
                if sub is not None:
                    _enter(sub, child, stack, specs, skipped)
            elif is_file:
                if _ignored_by(specs, child, False):
                    continue
                why = skipped_file(child, rules)
                if why is not None:
                    _note(skipped, child, why)
                    continue
                yield child, root / child
    finally:
        for fd, *_ in stack:
            os.close(fd)


def _note(skipped: list[Skipped] | None, path: str, reason: str, kind: str = "file") -> None:
    if skipped is not None:
        skipped.append(Skipped(path, reason, kind))


def _enter(fd: int, rel: str, stack: list[tuple[int, str, Iterator[os.DirEntry[str]], bool]],
           specs: list[tuple[str, object]], skipped: list[Skipped] | None, excludes: Sequence[str] = ()) -> None:
    """Push the directory `fd` (taking it over) onto walk's stack with its entries and ignore rules; closed if unlistable."""
    try:
        with os.scandir(fd) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError as exc:
        os.close(fd)
        _note(skipped, rel or ".", f"unreadable directory ({exc.strerror or type(exc).__name__})", "directory")
        return
    spec = _gitignore(fd, rel, skipped, excludes)
    if spec is not None:
        specs.append((rel, spec))
    stack.append((fd, rel, iter(entries), spec is not None))


def _open_subdir(fd: int, name: str, child: str, depth: int, specs: list[tuple[str, object]],
                 skipped: list[Skipped] | None) -> int | None:
    """The subdirectory `name` of `fd` opened for walk, or None when it is skipped, ignored, too deep or unreadable."""
    if name in SKIP_DIRS or name.endswith(".egg-info") or _ignored_by(specs, child, True):
        return None
    if depth > MAX_DEPTH:
        _note(skipped, child, f"deeper than {MAX_DEPTH} directory levels: not indexed", "directory")
        return None
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=fd)
    except OSError as exc:
        _note(skipped, child, LINK_NOT_FOLLOWED if exc.errno == errno.ELOOP
              else f"unreadable directory ({exc.strerror or type(exc).__name__})", "directory")
        return None


def _shown(rel: str) -> str:
    """A path whose name may not be valid UTF-8 (see name_problem), as a report can carry it."""
    return rel.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def excluded_reason(root: Path, rel: str, *, rules: WalkRules = WalkRules(), cache: dict | None = None) -> str | None:
    """Why `walk(root, rules=rules)` would leave out the file `rel` (None when it would index it).

    The same rules as the walk, for one path: so a file a worker names
    explicitly (a workspace overlay) is held to what the canonical index holds. `cache`: a dict kept
    across calls for many paths of one tree at one moment, so each directory's ignore rules are read once
    (a watcher's batch of 200k renames read and compiled them 200k times).
    """
    parts = PurePosixPath(rel).parts
    for d in parts[:-1]:
        if d in SKIP_DIRS or d.endswith(".egg-info"):
            return f"inside a skipped directory ({d}/)"
    why = skipped_type(parts[-1], rules.catalogs)
    if why is not None:
        return why
    why = _ignored_reason(root, parts, {} if cache is None else cache) or skipped_file(rel, rules)  # git's reason first
    return why


#: Why a path git ignores is left out (by a `.gitignore`, `.git/info/exclude` or the user's core.excludesFile).
IGNORED_BY_GIT = "ignored by git's ignore rules (.gitignore, .git/info/exclude or core.excludesFile)"


def _ignored_reason(root: Path, parts: tuple[str, ...], cache: dict) -> str | None:
    """IGNORED_BY_GIT when the ignore rules along `parts` (read as the walk reads them) leave the path out.

    `cache` maps a directory (its path under the root) to its compiled rules (None: it has none, or cannot
    be read); a directory not in it is opened down from the root, each step without following a link."""
    specs: list[tuple[str, object]] = []
    fd, depth = None, 0  # the directory parts[:depth], opened when a rule file must be read (-1: it cannot be)
    try:
        for i in range(len(parts)):
            base = "/".join(parts[:i])
            if base not in cache:
                fd, depth = _descend(root, parts[:i], fd, depth)
                cache[base] = _gitignore(fd, base, None, git_excludes.lines(root) if i == 0 else ()) if fd >= 0 else None
            if cache[base] is not None:
                specs.append((base, cache[base]))
            if _ignored_by(specs, "/".join(parts[: i + 1]), i < len(parts) - 1):
                return IGNORED_BY_GIT
    finally:
        if fd is not None and fd >= 0:
            os.close(fd)
    return None


def _descend(root: Path, dirs: tuple[str, ...], fd: int | None, depth: int) -> tuple[int, int]:
    """The directory `dirs` under `root` opened (from `fd`, already `depth` parts down; None: nothing open yet)."""
    if fd is None:
        try:
            fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return -1, len(dirs)
    while depth < len(dirs) and fd >= 0:
        try:
            sub = os.open(dirs[depth], _DIR_FLAGS, dir_fd=fd)
        except OSError:
            sub = -1
        os.close(fd)
        fd, depth = sub, depth + 1
    return fd, len(dirs)


def listed(root: Path, rels: Iterable[str], skipped: list[Skipped] | None = None, *,
           rules: WalkRules = WalkRules()) -> Iterator[tuple[str, Path]]:
    """What `walk(root, rules=rules)` would yield of the paths `rels` alone, sorted: each that is a regular file it would index.

    Why: re-indexing the few files a watcher saw change must hold them to the walk's rules
    without walking the whole tree. A path that is gone, a link, a directory or ignored is left out.
    """
    root = root.resolve()
    ignore_rules: dict = {}  # each directory's rules read once for all the paths (see excluded_reason)
    for rel in sorted(set(rels)):
        parts = PurePosixPath(rel).parts
        if not parts or len(parts) > MAX_DEPTH + 1 or any(p in ("..", ".") for p in parts):
            continue
        problem = next((name_problem(p) for p in parts if name_problem(p)), None)
        if problem is not None:
            if skipped is not None:
                skipped.append(Skipped(_shown(rel), problem))
            continue
        try:
            st = os.lstat(root / rel)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        reason = excluded_reason(root, rel, rules=rules, cache=ignore_rules)
        if reason is not None and reason == skipped_file(rel, rules):  # noted, as the walk notes it
            if skipped is not None:
                skipped.append(Skipped(rel, reason))
            continue
        if reason is None:
            yield rel, root / rel


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
