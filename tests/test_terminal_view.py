"""The terminal view (issue 35, item 3): a short, citations-first search on a terminal, the full pack
when piped, `rag repos`, an unknown repository in `rag stats`, "did you mean", examples in --help
and shell completion. Real CLI subprocesses (a pseudo-terminal where a terminal matters) or `main`."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tempfile

import pytest

from conftest import MOONMIND, Result

QUERY = ("rag", "search", "where is the bearer token checked", "--repo", "demo", "--top-k", "4", "--score-threshold", "0")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def on_a_terminal(env: dict, cwd, *args: str, extra_env: dict | None = None) -> Result:
    """Run the CLI with its stdout on a pseudo-terminal (as in an interactive shell); stderr captured apart."""
    import pty

    e = {**env, "TERM": "xterm-256color", "COLUMNS": "100"}
    e.pop("NO_COLOR", None)
    e.update(extra_env or {})
    master, slave = pty.openpty()
    with tempfile.TemporaryFile() as err:
        p = subprocess.Popen([MOONMIND, *args], stdin=subprocess.DEVNULL, stdout=slave, stderr=err, env=e, cwd=cwd)
        os.close(slave)
        out = []
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the process closed the terminal
                break
            if not data:
                break
            out.append(data)
        code = p.wait(timeout=120)
        os.close(master)
        err.seek(0)
        stderr = err.read().decode()
    return Result(code, b"".join(out).decode().replace("\r\n", "\n"), stderr)


# ------------------------------------------------------------------ the view ---


@pytest.mark.slow
def test_a_search_on_a_terminal_prints_short_citations_with_a_few_lines_each(prebuilt, env, tmp_path):
    r = on_a_terminal(env, tmp_path, *QUERY, extra_env={"NO_COLOR": "1"})
    assert r.code == 0, r.stderr
    assert "<<<BEGIN" not in r.stdout and "trust=canonical" not in r.stdout
    first = r.stdout.splitlines()[2]
    assert re.match(r"^1\. auth/tokens\.py#L\d+-L\d+  \d\.\d{3}  check_bearer_token", first), r.stdout
    assert '   1 """Bearer token checks for the API."""' in r.stdout  # a few of its lines, numbered as in the file
    hits = re.findall(r"^\d+\. \S+#L\d+-L\d+", r.stdout, re.M)
    assert len(hits) == 4 and len(r.stdout.splitlines()) <= 4 * 7 + 3


@pytest.mark.slow
def test_the_terminal_view_is_coloured(prebuilt, env, tmp_path):
    r = on_a_terminal(env, tmp_path, *QUERY)
    assert r.code == 0, r.stderr
    assert ANSI.search(r.stdout)
    assert re.search(r"auth/tokens\.py", ANSI.sub("", r.stdout))


@pytest.mark.slow
def test_no_color_turns_the_colour_off(prebuilt, env, tmp_path):
    r = on_a_terminal(env, tmp_path, *QUERY, extra_env={"NO_COLOR": "1"})
    assert r.code == 0, r.stderr
    assert "\x1b" not in r.stdout and "<<<BEGIN" not in r.stdout
    assert re.search(r"^1\. auth/tokens\.py#L", r.stdout, re.M), r.stdout


@pytest.mark.slow
def test_full_on_a_terminal_prints_the_context_pack_a_pipe_gets(prebuilt, env, cli, tmp_path):
    r = on_a_terminal(env, tmp_path, *QUERY, "--full")
    assert r.code == 0, r.stderr
    piped = cli(*QUERY)
    assert piped.code == 0, piped.stderr
    assert "<<<BEGIN MOONMIND RETRIEVED CONTEXT" in r.stdout and "\x1b" not in r.stdout
    assert r.stdout == piped.stdout


@pytest.mark.slow
def test_short_when_piped_prints_the_short_view_without_colour(prebuilt, cli):
    r = cli(*QUERY, "--short")
    assert r.code == 0, r.stderr
    assert "<<<BEGIN" not in r.stdout and "\x1b" not in r.stdout
    assert re.search(r"^1\. auth/tokens\.py#L\d+-L\d+", r.stdout, re.M), r.stdout


@pytest.mark.slow
def test_the_short_view_through_the_owner_keeps_the_thin_client_thin(indexed, env, home, tmp_path):
    from test_owner import start_owner, stop

    proc = start_owner(env, home)
    try:
        r = on_a_terminal(env, tmp_path, *QUERY, extra_env={"PYTHONPROFILEIMPORTTIME": "1"})
    finally:
        stop(proc)
    assert r.code == 0, r.stderr
    assert re.search(r"^1\. auth/tokens\.py#L", ANSI.sub("", r.stdout), re.M), r.stdout
    imported = {line.split("|")[-1].strip().split(".")[0] for line in r.stderr.splitlines() if line.startswith("import time:")}
    assert "moonmind_worker" in imported, "import profile missing"
    assert not imported & {"numpy", "pydantic", "pydantic_core", "qdrant_client", "qdrant_edge", "celery", "typing"}


def test_the_short_view_shows_escapes_in_retrieved_text_as_text_and_marks_overlay_hits():
    from moonmind_worker.cli.view import short_view

    item = {"source": "evil\x1b[2J.py", "line_start": 3, "line_end": 4, "score": 0.5, "section_title": "f\u202e",
            "trust_class": "overlay", "text": "x = 1\nprint('\x1b]0;pwned\x07')\n", "payload": {"repo": "demo"}}
    out = short_view({"query": "print", "items": [item]}, colour=False)
    assert "\x1b" not in out and "\u202e" not in out and "\x07" not in out
    assert "evil\\u001b[2J.py#L3-L4" in out and "[overlay:" in out
    assert "   4 print('\\u001b]0;pwned\\u0007')" in out  # from the line naming the query, numbered as in the file


# --------------------------------------------------------------- rag repos ---


@pytest.mark.slow
def test_rag_repos_lists_each_repository_with_tenant_files_chunks_model_and_time(prebuilt, cli):
    r = cli("rag", "repos", "--json")
    assert r.code == 0, r.stderr
    stats = cli("rag", "stats", "--repo", "demo", "--tenant", "acme", "--json").json()
    (row,) = r.json()
    assert (row["repo"], row["tenant"], row["files"], row["chunks"]) == ("demo", "acme", len(stats["files"]), stats["chunks"])
    assert row["model"] and re.match(r"^\d{4}-\d\d-\d\dT", row["last_indexed"])


@pytest.mark.slow
def test_rag_repos_prints_a_table(prebuilt, cli):
    r = cli("rag", "repos")
    assert r.code == 0, r.stderr
    header, row = r.stdout.splitlines()[:2]
    assert header.split() == ["repository", "tenant", "files", "chunks", "model", "last", "indexed", "source"]
    assert row.split()[:2] == ["demo", "acme"]
    assert row.endswith("files (not a git checkout: content hashes)")


def _git(tree, *args: str) -> str:
    return subprocess.run(["git", "-C", str(tree), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.mark.slow
def test_the_index_of_a_git_checkout_records_its_commit_tree_and_branch(cli, repo):
    """Issue 53, item 1: a base knows its commit."""
    _git(repo, "init", "-q", "-b", "trunk")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@example.com", "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "first")
    assert cli("rag", "index", str(repo), "--repo", "demo").code == 0
    (row,) = cli("rag", "repos", "--json").json()
    assert row["source"] == {"kind": "git", "commit": _git(repo, "rev-parse", "HEAD"), "branch": "trunk", "uncommitted": 0,
                             "tree": _git(repo, "rev-parse", "HEAD^{tree}"), "toplevel": str(repo.resolve())}
    (repo / "db" / "pool.py").write_text("def drained():\n    return []\n")  # an uncommitted change, indexed
    assert cli("rag", "index", str(repo), "--repo", "demo").code == 0
    stats = cli("rag", "stats", "--repo", "demo")
    assert f"source: trunk@{_git(repo, 'rev-parse', 'HEAD')[:12]} +1 uncommitted" in stats.stdout
    assert cli("rag", "stats", "--repo", "demo", "--json").json()["source"]["uncommitted"] == 1


@pytest.mark.slow
def test_rag_repos_inside_a_job_cannot_list_another_tenant(prebuilt, cli):
    job = {"MOONMIND_JOB_ID": "job-1", "MOONMIND_TENANT": "acme"}
    r = cli("rag", "repos", "--tenant", "globex", "--json", extra_env=job)
    assert r.code == 4 and r.stdout == "" and r.error()["code"] == "forbidden"
    assert [row["tenant"] for row in cli("rag", "repos", "--json", extra_env=job).json()] == ["acme"]


def test_rag_repos_on_an_empty_box_says_how_to_index(invoke, home):
    r = invoke("rag", "repos")
    assert r.code == 0, r.stderr
    assert "moonmind rag index" in r.stdout
    assert invoke("rag", "repos", "--json").json() == []


@pytest.mark.slow
def test_stats_of_an_unknown_repository_is_an_error_naming_the_known_ones(prebuilt, cli):
    r = cli("rag", "stats", "--repo", "nosuch", "--json")
    assert r.code == 2 and r.stdout == ""
    err = r.error()
    assert err["code"] == "invalid_argument" and "nosuch" in err["message"]
    assert "demo (tenant acme)" in err["action"]


# ----------------------------------------------------------- did you mean ---


def _usage_error(argv: list[str], capsys) -> str:
    from moonmind_worker.cli.main import main

    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    return err


def test_a_mistyped_flag_names_the_flag_it_was_meant_to_be(env, capsys):
    err = _usage_error(["rag", "search", "query", "--top_k", "3"], capsys)
    assert "Did you mean `--top-k`?" in err and "moonmind rag search --help" in err


def test_a_command_given_without_its_group_names_the_full_command(env, capsys):
    err = _usage_error(["search", "query"], capsys)
    assert "Did you mean `moonmind rag search`?" in err


def test_a_mistyped_command_names_the_command_it_was_meant_to_be(env, capsys):
    err = _usage_error(["rag", "serch", "query"], capsys)
    assert "Did you mean `moonmind rag search`?" in err


# ------------------------------------------------------------ help examples ---


@pytest.mark.parametrize("command", ["", "rag index", "rag search", "rag repos", "rag stats", "worker doctor", "completion"])
def test_the_help_of_the_main_commands_ends_with_examples(command, env, capsys):
    from moonmind_worker.cli.main import main

    with pytest.raises(SystemExit):
        main([*command.split(), "--help"])
    out = capsys.readouterr().out
    examples = out[out.index("examples:"):]
    assert f"moonmind {command}".strip() in examples


def test_every_example_in_help_parses(env):
    from moonmind_worker.cli.main import EXAMPLES, build_parser

    checked = 0
    for text in EXAMPLES.values():
        for line in text.splitlines():
            command = re.split(r" {2,}| [|>] ", line.strip())[0]
            if not command.startswith("moonmind "):
                continue
            argv = shlex.split(command)[1:]
            build_parser(argv).parse_args(argv)
            checked += 1
    assert checked >= 15


# -------------------------------------------------------------- completion ---


def _complete(script: str, line: str) -> list[str]:
    """What bash completes for `line` (the word being completed is its last, possibly empty)."""
    words = line.split(" ")
    probe = (f"{script}\nCOMP_WORDS=({' '.join(shlex.quote(w) for w in words)}); COMP_CWORD={len(words) - 1}\n"
             '_moonmind; printf "%s\\n" "${COMPREPLY[@]}"\n')
    p = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and not p.stderr, p.stderr
    return p.stdout.split()


def test_bash_completion_completes_commands_sub_commands_flags_and_choices(invoke):
    r = invoke("completion", "bash")
    assert r.code == 0, r.stderr
    assert _complete(r.stdout, "moonmind r") == ["rag"]
    assert _complete(r.stdout, "moonmind rag se") == ["search"]
    assert _complete(r.stdout, "moonmind rag overlay up") == ["upsert"]
    assert _complete(r.stdout, "moonmind rag search query --top") == ["--top-k"]
    assert _complete(r.stdout, "moonmind rag search query --execution ") == ["sync", "queue"]
    assert _complete(r.stdout, "moonmind completion ") == ["bash", "zsh"]


def test_zsh_completion_names_every_command(invoke):
    from moonmind_worker.cli.main import COMMANDS

    r = invoke("completion", "zsh")
    assert r.code == 0, r.stderr
    assert r.stdout.startswith("#compdef moonmind\n")
    for group, command in COMMANDS:
        assert f"'{group} {command}'".replace(" '", "'") in r.stdout


@pytest.mark.skipif(not shutil.which("zsh"), reason="zsh is not installed")
def test_zsh_completion_completes_commands_flags_and_choices(invoke, tmp_path):
    script = tmp_path / "_moonmind"
    script.write_text(invoke("completion", "zsh").stdout)
    probe = (  # the completion system's own functions stubbed: what the script offers is printed
        "compdef() { :; }\ncompadd() { [[ $1 == -- ]] && shift; print -l -- \"$@\"; }\n_files() { print FILES; }\n"
        f"source {shlex.quote(str(script))}\n"
        "words=(moonmind rag se); CURRENT=3; _moonmind\nprint -r -- SEP\n"
        "words=(moonmind rag search q --execution ''); CURRENT=6; _moonmind\nprint -r -- SEP\n"
        "words=(moonmind rag search q ''); CURRENT=5; _moonmind\n"
    )
    p = subprocess.run(["zsh", "-f", "-c", probe], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and not p.stderr, p.stderr
    commands, choices, files = (part.split() for part in p.stdout.split("SEP"))
    assert "search" in commands and "index" in commands  # compadd itself keeps those matching the prefix
    assert choices == ["sync", "queue"] and files == ["FILES"]
