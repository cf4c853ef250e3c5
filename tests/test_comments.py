"""Comments, docstrings and docs name only `*.py` files that exist: a rename or a split carries its mentions along.

A mention resolves when the file exists relative to the mentioning file's directory or any directory
above it up to the repository root, or relative to the package (`moonmind_worker/`), so `owner/ops.py`
written anywhere means moonmind_worker/owner/ops.py; a bare name (`edge.py`, no directory) resolves
when a file of that name exists anywhere in the repository. Third-party trees (any `corpus/`), the
virtual environment and build outputs are not the repository: a name found only there does not resolve.
"""

from __future__ import annotations

import ast
import io
import os
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "moonmind_worker"

#: Where comments and docstrings are read (Python files); the docs (README.md, BENCHMARKS.md, docs/) are read whole.
SOURCE_DIRS = ("moonmind_worker", "tasks", "bootstrap", "bench", "scripts", "docs")

#: Not the repository's own files: third-party source kept as benchmark data, environments, build outputs.
#: (`corpus`: bench/corpus and training/corpus hold other projects' source as data.)
NOT_OURS = {".git", ".venv", "venv", "node_modules", "__pycache__", "build", "dist", ".mypy_cache", ".ruff_cache",
            ".pytest_cache", "corpus"}

#: Names of files that are not in this repository on purpose, each with why it may be named.
ALLOWED = {
    "auth/tokens.py": "an example location in a user's repository (`rag related auth/tokens.py#L10-L40`)",
    "a/b/c.py": "an example path (the parents of a repository-relative path)",
    "lib.py": "an example file of an indexed repository (overlay tombstones per repository)",
    "background.py": "an example file of an indexed repository (a query naming it: the path signal)",
    "argparse.py": "the standard library's module",
    "fastapi/_body_limit.py": "a file of the fastapi wheel (bench/corpus) the suite overlays, named in its BENCHMARKS.md rows",
}

#: A path-like token ending in `.py`: not part of a URL, a dotted name or a longer suffix (`.pyi`).
PY_NAME = re.compile(r"(?<![\w./:~-])((?:\.\.?/)*(?:[\w-]+/)*[\w-]+\.py)(?![\w])")


def _ours(dirpath: Path) -> bool:
    return dirpath.name not in NOT_OURS and not dirpath.name.endswith(".egg-info")


def repository_files() -> list[Path]:
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(ROOT):
        here = Path(dirpath)
        dirnames[:] = [d for d in dirnames if _ours(here / d)]
        found.extend(here / f for f in filenames)
    return found


def comments_and_docstrings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of the comments and the module, class and function docstrings of a Python file that may name a file."""
    source = path.read_text(encoding="utf-8")
    naming = {i for i, line in enumerate(source.splitlines(), 1) if PY_NAME.search(line)}
    if not naming:
        return []
    found: list[tuple[int, str]] = []
    for node in _with_docstrings(ast.parse(source, str(path))):
        first = node.body[0]
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
            found.extend((first.lineno + i, line) for i, line in enumerate(first.value.value.splitlines()))
    if naming - {line for line, _ in found}:  # tokenized only then: tokenizing every file makes this test slow
        found.extend((t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(source).readline)
                     if t.type == tokenize.COMMENT)
    return found


def _with_docstrings(node: ast.AST) -> list:
    """The module and every class and function in it, through statements only (`ast.walk` visits every expression)."""
    found = [node] if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body else []
    for field in ("body", "orelse", "finalbody", "handlers", "cases"):
        for child in getattr(node, field, ()):
            if isinstance(child, (ast.stmt, ast.excepthandler, ast.match_case)):
                found.extend(_with_docstrings(child))
    return found


def texts_to_check() -> list[tuple[Path, int, str]]:
    out: list[tuple[Path, int, str]] = []
    for top in SOURCE_DIRS:
        for path in sorted((ROOT / top).rglob("*.py")):
            if all(_ours(d) for d in path.parents if ROOT in d.parents):
                out.extend((path, line, text) for line, text in comments_and_docstrings(path))
    pages = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for page in pages:
        out.extend((page, i, line) for i, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1))
    return out


def resolves(name: str, mentioned_in: Path, names: set[str]) -> bool:
    if name in ALLOWED:
        return True
    bases = [mentioned_in.parent, *(d for d in mentioned_in.parent.parents if d == ROOT or ROOT in d.parents), PACKAGE]
    if any((base / name).is_file() and _ours_file(base / name) for base in bases):
        return True
    return "/" not in name and name in names


def _ours_file(path: Path) -> bool:
    path = path.resolve()
    return all(_ours(d) for d in path.parents if ROOT in d.parents or d == ROOT)


def test_every_py_file_a_comment_docstring_or_doc_names_exists():
    names = {p.name for p in repository_files() if p.suffix == ".py"}
    mentions = [(path, line, name) for path, line, text in texts_to_check() for name in PY_NAME.findall(text)]
    assert len(mentions) > 50, "the scan found almost no mention: are the source folders still there?"
    missing = [f"{path.relative_to(ROOT)}:{line}: {name}" for path, line, name in mentions if not resolves(name, path, names)]
    assert not missing, "these name files that do not exist (say the current path, or ALLOWED with a reason):\n" + "\n".join(missing)


def test_the_check_catches_a_stale_name_and_passes_a_current_one():
    names = {p.name for p in repository_files() if p.suffix == ".py"}
    here = PACKAGE / "owner" / "client.py"
    found = PY_NAME.findall("see cli.py, owner/ops.py, commands/rag.py, https://x.org/y/z.py and types.pyi")
    assert found == ["cli.py", "owner/ops.py", "commands/rag.py"]
    assert [resolves(n, here, names) for n in found] == [False, True, False]
    assert resolves("main.py", PACKAGE / "cli" / "rag.py", names)  # the file's own package
    assert resolves("docs/examples/rag_job.py", ROOT / "README.md", names)  # the repository root
    assert not resolves("_make.py", ROOT / "README.md", names), "a corpus is third-party, not the repository's"
