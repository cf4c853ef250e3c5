"""Every command in README.md and docs/ runs as written (issue 35, item 8).

The fenced shell blocks are extracted; each must parse (`bash -n`), every `moonmind` command in
them must name real commands and flags (checked against `moonmind <command> --help`), and the
files and modules they name must exist. The lines that need no server (`rag index`, `rag search`,
overlays, `worker doctor`, ...) are then run as written, in document order, in a git work tree
with an uncommitted edit and a fresh MOONMIND_HOME; a block stops running at its first line that
needs a server, a network or the reader's own values (`...`, `<token>`, `[--optional]`).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pytest

from conftest import FIXTURE_FILES, MOONMIND, write_tree

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```", re.M | re.S)
SHELL_LANGS = {"", "sh", "bash", "shell", "console"}
#: a block whose first command is not one of these is output or a listing, not commands
PROGRAMS = {"moonmind", "python", "python3", "pip", "celery", "export", "docker", "curl", "claude", "uptime",
            "redis-server", "git", "bash", "sh", "mkdir", "cd", "unzip", "/usr/bin/time"}
SPLIT = {"&&", "||", ";", "|", "(", ")", "&"}
PLACEHOLDER = re.compile(r"<[a-z][^<>\n]*>")
#: settings that point at a server this test does not have
SERVER_VARS = {"QDRANT_URL", "QDRANT_API_KEY", "MOONMIND_RETRIEVAL_URL", "MOONMIND_RETRIEVAL_TOKEN",
               "MOONMIND_EMBEDDING_PROVIDER", "CELERY_BROKER_URL", "GOOGLE_API_KEY", "OPENAI_API_KEY"}
#: moonmind commands that serve until stopped
SERVES = {("serve",), ("mcp",), ("gateway", "serve")}


@dataclass
class Block:
    page: str
    line: int
    lines: list[str]  # logical command lines: continuations joined, prompts and comment lines dropped

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def logical_lines(body: str) -> list[str]:
    raw = body.splitlines()
    transcript = any(line.startswith("$ ") for line in raw)  # `$ cmd` then its output
    out: list[str] = []
    cur = ""
    for line in raw:
        if not cur:
            if transcript:
                if not line.startswith("$ "):
                    continue
                line = line[2:]
            if not line.strip() or line.lstrip().startswith("#"):
                continue
        cur = f"{cur} {line.strip()}" if cur else line.strip()
        if cur.endswith("\\"):
            cur = cur[:-1].rstrip()
            continue
        out.append(cur)
        cur = ""
    if cur:
        out.append(cur)
    return out


def words(line: str) -> list[str]:
    """The line's tokens as the shell splits them (comments dropped, `$(...)` one word, placeholders a word)."""
    text = PLACEHOLDER.sub("PLACEHOLDER", line)
    text = re.sub(r"\$\([^()]*\)", "SUBST", text)
    lex = shlex.shlex(text, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    lex.commenters = "#"
    return list(lex)


def simple_commands(line: str) -> list[list[str]]:
    out: list[list[str]] = [[]]
    redirect = False
    for tok in words(line):
        if redirect:  # a redirection's target is no argument
            redirect = False
        elif re.match(r"^\d*[<>]+&?$", tok):
            redirect = True
        elif tok in SPLIT:
            out.append([])
        else:
            out[-1].append(tok)
    cmds = [c for c in out if c]
    for c in cmds:  # leading VAR=value assignments are not the program
        while len(c) > 1 and re.match(r"^[A-Za-z_]\w*=", c[0]):
            del c[0]
    return cmds


def program(cmd: list[str]) -> str:
    return cmd[0]


def shell_blocks() -> list[Block]:
    blocks = []
    for page in PAGES:
        text = page.read_text()
        for m in FENCE.finditer(text):
            if m.group(1) not in SHELL_LANGS:
                continue
            lines = logical_lines(m.group(2))
            if not lines or simple_commands(lines[0])[0][0] not in PROGRAMS:
                continue
            blocks.append(Block(page.relative_to(ROOT).as_posix(), text[: m.start()].count("\n") + 1, lines))
    return blocks


def moonmind_args(cmd: list[str]) -> list[str] | None:
    """What follows `moonmind` (or `python -m moonmind_worker`) in a simple command, else None."""
    for i, tok in enumerate(cmd):
        nxt = cmd[i + 1] if i + 1 < len(cmd) else ""
        if Path(tok).name == "moonmind" and (nxt in top_commands() or nxt in ("--version", "--help", "-h")):
            return cmd[i + 1:]
        if tok == "-m" and nxt == "moonmind_worker":
            return cmd[i + 2:]
    return None


def help_env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("MOONMIND_", "QDRANT_", "CELERY_"))}
    e.update(MOONMIND_OWNER="off", COLUMNS="200", MOONMIND_HOME=_help_home())
    return e


@lru_cache(maxsize=None)
def _help_home() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="mm-doc-help-")  # --help reads no store; a fresh home all the same


@lru_cache(maxsize=None)
def help_of(argv: tuple[str, ...], cwd: str = str(ROOT)) -> tuple[int, str]:
    p = subprocess.run([*argv, "--help"], capture_output=True, text=True, env=help_env(), cwd=cwd, timeout=120)
    return p.returncode, p.stdout + p.stderr


def subcommands(help_text: str) -> set[str]:
    """The sub-commands an argparse help lists (`{a,b}` or one per line, indented 4, under "positional arguments")."""
    m = re.search(r"^positional arguments:\n((?:[ \t]+.*\n?)*)", help_text, re.M)
    if not m:
        return set()
    section = m.group(1)
    choices = re.search(r"^  \{([\w,-]+)\}", section, re.M)
    return set(re.findall(r"^    ([a-z][\w-]*)", section, re.M)) | (set(choices.group(1).split(",")) if choices else set())


@lru_cache(maxsize=None)
def top_commands() -> frozenset[str]:
    code, text = help_of((MOONMIND,))
    assert code == 0, text
    return frozenset(subcommands(text))


def flags(args: list[str]) -> list[str]:
    out = []
    for tok in args:
        tok = tok.strip("[]")
        if tok.startswith("-") and tok not in ("-", "--") and not re.match(r"^-\d", tok):
            out.append(tok.split("=", 1)[0])
    return out


def has_flag(help_text: str, flag: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", help_text) is not None


def check_moonmind(args: list[str]) -> list[str]:
    """Problems with one moonmind command line: an unknown command or a flag its --help does not list."""
    path: list[str] = []
    rest = list(args)
    while True:
        code, text = help_of((MOONMIND, *path))
        if code != 0:
            return [f"`moonmind {' '.join(path)} --help` fails: {text.strip()[-300:]}"]
        choices = subcommands(text)
        if not choices or not rest or rest[0].startswith("-"):
            break
        word = rest.pop(0)
        if word not in choices:
            return [f"`moonmind {' '.join(path)}` has no command {word!r} (it has {', '.join(sorted(choices))})"]
        path.append(word)
    return [f"`moonmind {' '.join(path)}` has no flag {f}" for f in flags(rest) if not has_flag(text, f)]


def check_other(cmd: list[str]) -> list[str]:
    """Modules, scripts and files a non-moonmind command names; bench and celery flags against their --help."""
    problems = []
    prog = Path(program(cmd)).name
    for tok in cmd[1:]:
        if re.match(r"^(?:[\w.-]+/)+[\w.-]+\.(?:json|ya?ml|py|md|sh|toml)$", tok) and not (ROOT / tok).exists():
            problems.append(f"{tok} does not exist")
    if prog in ("python", "python3") and len(cmd) > 2 and cmd[1] == "-m":
        module = cmd[2]
        if module.split(".")[0] == "bench":
            code, text = help_of((sys.executable, "-m", module))
            if code != 0:
                problems.append(f"`python -m {module} --help` fails: {text.strip()[-300:]}")
            problems += [f"`python -m {module}` has no flag {f}" for f in flags(cmd[3:]) if not has_flag(text, f)]
        else:
            import importlib.util

            if importlib.util.find_spec(module) is None:
                problems.append(f"no module {module}")
    if prog in ("python", "python3") and len(cmd) > 1 and cmd[1].endswith(".py"):
        code, text = help_of((sys.executable, cmd[1]))
        if code != 0:
            problems.append(f"`python {cmd[1]} --help` fails: {text.strip()[-300:]}")
        problems += [f"`python {cmd[1]}` has no flag {f}" for f in flags(cmd[2:]) if not has_flag(text, f)]
    if prog == "celery" and "-A" in cmd:
        i = cmd.index("-A")
        app, sub = cmd[i + 1], cmd[i + 2]
        code, text = help_of((str(Path(sys.executable).parent / "celery"), "-A", app, sub))
        if code != 0:
            problems.append(f"`celery -A {app} {sub} --help` fails: {text.strip()[-300:]}")
        problems += [f"`celery {sub}` has no flag {f}" for f in flags(cmd[i + 3:]) if not has_flag(text, f)]
    return problems


def runnable(line: str) -> bool | None:
    """True: run it here. False: it needs a server, a network or the reader's values. None: done already."""
    if re.match(r"^pip install -e ", line):
        return None  # the package under test is installed
    if re.search(r"\[|\.\.\.|…|<[a-z]", line):
        return False
    for cmd in simple_commands(line):
        prog = program(cmd)
        if prog == "export":
            if any(tok.split("=", 1)[0] in SERVER_VARS for tok in cmd[1:]):
                return False
        elif prog in ("git", "mkdir", "cd"):
            continue
        elif (args := moonmind_args(cmd)) is not None and Path(prog).name == "moonmind":
            path = tuple(a for a in args[:2] if re.match(r"^[a-z][\w-]*$", a))
            if path[:1] in SERVES or path in SERVES or "queue" in args:
                return False
        else:
            return False
    return True


# ------------------------------------------------------------------ tests ---


def test_the_docs_have_shell_blocks_and_every_one_parses():
    blocks = shell_blocks()
    assert any(b.page == "README.md" and any(line.startswith("moonmind rag index") for line in b.lines) for b in blocks)
    problems = []
    for b in blocks:
        script = PLACEHOLDER.sub("PLACEHOLDER", "\n".join(b.lines))
        p = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True, timeout=30)
        if p.returncode != 0:
            problems.append(f"{b.where}: bash cannot parse it: {p.stderr.strip()}")
        for line in b.lines:
            try:
                simple_commands(line)
            except ValueError as err:
                problems.append(f"{b.where}: {line!r}: {err}")
    assert not problems, "\n".join(problems)


@pytest.mark.slow
def test_every_documented_command_names_real_commands_flags_and_files():
    problems = []
    checked = 0
    for b in shell_blocks():
        for line in b.lines:
            for cmd in simple_commands(line):
                args = moonmind_args(cmd)
                found = check_moonmind(args) if args is not None else check_other(cmd)
                checked += args is not None
                problems += [f"{b.where}: {line!r}: {p}" for p in found]
    for page in PAGES:  # and the `moonmind …` spans of the prose
        prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), page.read_text())
        for m in re.finditer(r"`(moonmind [^`\n]+)`", prose.replace("\\|", "|")):  # `\|`: a table's escaped |
            where = f"{page.relative_to(ROOT).as_posix()}:{prose[: m.start()].count(chr(10)) + 1}"
            try:
                cmds = simple_commands(m.group(1))
            except ValueError as err:
                problems.append(f"{where}: `{m.group(1)}`: {err}")
                continue
            for cmd in cmds:
                if (args := moonmind_args(cmd)) is not None:
                    checked += 1
                    problems += [f"{where}: `{m.group(1)}`: {p}" for p in check_moonmind(args)]
    assert checked >= 40
    assert not problems, "\n".join(problems)


@pytest.mark.slow
def test_the_commands_that_need_no_server_run_as_written(env, tmp_path):
    ws = write_tree(tmp_path / "myrepo", FIXTURE_FILES)
    for args in (("init", "-q"), ("config", "user.email", "docs@example.invalid"), ("config", "user.name", "docs"),
                 ("add", "-A"), ("commit", "-qm", "initial")):
        subprocess.run(["git", *args], cwd=ws, check=True, capture_output=True)
    (ws / "auth" / "tokens.py").write_text("def check_bearer_token(header):\n    return header == 'edited'\n")
    (ws / "auth" / "scopes.py").write_text("def token_scopes(token):\n    return ['read']\n")
    e = dict(env)
    e["PATH"] = f"{Path(MOONMIND).parent}{os.pathsep}{e.get('PATH', '')}"

    ran: list[str] = []
    failures = []
    for b in shell_blocks():
        lines = []
        for line in b.lines:
            verdict = runnable(line)
            if verdict is False:
                break
            if verdict:
                lines.append(line)
        if not lines:
            continue
        p = subprocess.run(["bash", "-e", "-c", "\n".join(lines)], cwd=ws, env=e, capture_output=True, text=True,
                           timeout=300)
        ran += [f"{b.where}: {line}" for line in lines]
        if p.returncode != 0:
            failures.append(f"{b.where} (exit {p.returncode}):\n  " + "\n  ".join(lines) + f"\n{p.stderr[-1500:]}")
    assert not failures, "\n\n".join(failures)
    joined = "\n".join(ran)
    for expected in ("README.md", "moonmind rag index . --repo myrepo", "moonmind rag search", "moonmind rag overlay upsert"):
        assert expected in joined, f"{expected!r} was not run:\n{joined}"
