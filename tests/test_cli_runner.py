"""The in-process CLI harness (tests/cli_runner.py) answers as the console script does and leaves this process as it was."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

from conftest import MOONMIND


def test_in_process_answers_what_the_console_script_answers(invoke, env, tmp_path):
    for args in (["--version"], ["rag", "search", "--query", "x", "--top-k", "0", "--json"], ["rag", "nosuch"]):
        p = subprocess.run([MOONMIND, *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
        r = invoke(*args)
        assert (r.code, r.stdout, r.stderr) == (p.returncode, p.stdout, p.stderr), args


def test_environment_directory_streams_and_log_handlers_are_put_back(invoke, tmp_path):
    before = (dict(os.environ), os.getcwd(), sys.stdout, sys.stderr, sys.stdin, list(logging.getLogger().handlers))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = invoke("rag", "search", "--query", "x", "--json", extra_env={"RAG_SIMILARITY_TOP_K": "0"}, cwd=elsewhere)
    assert r.code == 2 and r.error()["code"] == "invalid_setting"
    assert "RAG_SIMILARITY_TOP_K" not in os.environ
    assert before == (dict(os.environ), os.getcwd(), sys.stdout, sys.stderr, sys.stdin, list(logging.getLogger().handlers))
