"""Every file a command reads by name is a regular file, read within a bound: a FIFO or a device
in its place is a clear error, never a hang or a MemoryError (issue 18, major 6 and its class)."""

from __future__ import annotations

import os
import subprocess

import pytest

from conftest import MOONMIND

SPECIAL = ["fifo", "/dev/zero"]


def _special(kind: str, tmp_path) -> str:
    if kind == "fifo":
        path = tmp_path / "named.fifo"
        os.mkfifo(path)
        return str(path)
    return kind


def _run(env, *args, timeout: float = 20) -> subprocess.CompletedProcess:
    """The command, which must not block on the special file: a stall raises TimeoutExpired."""
    return subprocess.run([MOONMIND, *args], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("kind", SPECIAL)
def test_rag_eval_refuses_a_query_file_that_is_not_a_regular_file(env, kind, tmp_path):
    r = _run(env, "rag", "eval", "--queries", _special(kind, tmp_path))
    assert r.returncode == 2 and "not a regular file" in r.stderr


@pytest.mark.parametrize("kind", SPECIAL)
def test_job_start_refuses_a_manifest_that_is_not_a_regular_file(env, kind, tmp_path):
    r = _run(env, "job", "start", "--manifest", _special(kind, tmp_path))
    assert r.returncode == 2 and "not a regular file" in r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("kind", SPECIAL)
def test_the_gateway_refuses_a_token_file_that_is_not_a_regular_file_before_serving(env, kind, tmp_path):
    r = _run({**env, "MOONMIND_GATEWAY_TOKENS_FILE": _special(kind, tmp_path)}, "gateway", "serve", "--port", "0")
    assert r.returncode == 3 and "not a regular file" in r.stderr
    assert "serving the embedded store" not in r.stderr


@pytest.mark.slow
def test_a_fifo_named_gitignore_does_not_stall_indexing(cli, repo):
    os.mkfifo(repo / "sub.gitignore.fifo")
    (repo / "nested").mkdir()
    os.mkfifo(repo / "nested" / ".gitignore")
    (repo / "nested" / "mod.py").write_text("def nested_function():\n    return 1\n")
    r = cli("rag", "index", str(repo), "--repo", "demo", timeout=40)  # a read that blocks on a FIFO raises TimeoutExpired
    assert r.code == 0, r.stderr
