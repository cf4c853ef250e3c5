"""Index progress on stderr (issue 19): periodic lines in a log, a bar with rate and ETA on a terminal,
and a clean line on Ctrl-C. Real `moonmind rag index` processes; the only stand-in is the remote
embedding API (a local OpenAI-compatible server that answers each batch after a delay, so a run
lasts long enough to report on)."""

from __future__ import annotations

import os
import pty
import re
import signal
import subprocess
import threading
import time

import pytest

from conftest import MOONMIND, write_tree

pytestmark = pytest.mark.slow

LINE = re.compile(r"^progress: (\d+)/(\d+) files \(\d+%\), (\d+) chunks, [\d.]+ files/s(?:, (ETA \S+|\S+ in all))?$")
#: a line while the figures stand still: before the first file, while a batch is embedded, after the last file
PHASE = re.compile(r"^progress: (starting: .*, [\d.]+s|\d+/\d+ files \(\d+%\), \d+ chunks; .*, \S+ so far)$")


@pytest.fixture
def slow_embedder(env):
    yield from _embedder_answering_after(env, 0.05)


@pytest.fixture
def slower_embedder(env):
    """Each batch after 0.2 s (a run of ~8 s): still going when the interrupt lands, however loaded the machine."""
    yield from _embedder_answering_after(env, 0.2)


def _embedder_answering_after(env, delay_s: float):
    from http_servers import EmbeddingsServer

    server = EmbeddingsServer(repeat=2)
    server.delay_s = delay_s
    yield {**env, "MOONMIND_EMBEDDING_PROVIDER": "openai", "OPENAI_API_KEY": "sk-progress",
           "OPENAI_BASE_URL": server.base_url, "MOONMIND_EMBEDDING_MODEL": "local-embed-512",
           "MOONMIND_EMBEDDING_BATCH_SIZE": "16"}
    server.close()


@pytest.fixture
def tree(tmp_path):
    return write_tree(tmp_path / "tree", {f"pkg/mod_{i}.py": f"def handler_{i}(request):\n    return {i}\n" * 100
                                          for i in range(200)})


def run_on_a_terminal(args: list[str], env: dict[str, str], interrupt_on: str | None = None) -> tuple[int, str]:
    """Run with stderr on a pseudo-terminal (SIGINT once `interrupt_on` shows); the exit code and what it got."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=slave, stdin=subprocess.DEVNULL)
    os.close(slave)
    chunks: list[bytes] = []

    def read() -> None:
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    if interrupt_on is not None:
        deadline = time.monotonic() + 120
        while interrupt_on not in b"".join(chunks).decode(errors="replace") and time.monotonic() < deadline:
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
    code = proc.wait(120)
    reader.join(5)
    os.close(master)
    return code, b"".join(chunks).decode(errors="replace")


def test_redirected_stderr_gets_a_plain_progress_line_every_interval(slow_embedder, tree, tmp_path):
    env = {**slow_embedder, "MOONMIND_PROGRESS_INTERVAL_S": "0.3"}
    p = subprocess.run([MOONMIND, "rag", "index", str(tree), "--repo", "big"], env=env, capture_output=True,
                       text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    lines = [line for line in p.stderr.splitlines() if line.startswith("progress:")]
    assert len(lines) >= 2, p.stderr
    assert all(LINE.match(line) or PHASE.match(line) for line in lines), lines
    assert "\r" not in p.stderr
    done, total, _chunks, tail = LINE.match(lines[-1]).groups()
    assert done == total == "200" and tail.endswith("in all")
    assert p.stdout.startswith("indexed repo=big")


def test_a_short_run_in_a_log_prints_no_progress_at_all(env, repo, tmp_path):
    p = subprocess.run([MOONMIND, "rag", "index", str(repo), "--repo", "demo"], env=env, capture_output=True,
                       text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 0 and p.stderr == ""


def test_a_terminal_gets_a_bar_with_rate_and_eta(slow_embedder, tree):
    code, out = run_on_a_terminal([MOONMIND, "rag", "index", str(tree), "--repo", "big"], slow_embedder)
    assert code == 0, out
    frames = [f for f in out.split("\r") if f.startswith("[")]
    assert any(re.search(r"\d+/200 files \(\d+%\), \d+ chunks  [\d.]+ files/s, ETA \S+", f) for f in frames), frames
    assert re.search(r"200/200 files \(100%\), \d+ chunks  [\d.]+ files/s, \S+ in all", out)


def test_ctrl_c_during_the_bar_prints_interrupted_on_a_line_of_its_own(slower_embedder, tree):
    code, out = run_on_a_terminal([MOONMIND, "rag", "index", str(tree), "--repo", "big"], slower_embedder,
                                  interrupt_on="ETA")
    assert code == 130, out
    assert "files/s" in out and "/200 files" in out  # the bar was drawn, and was still running
    # the bar's line is ended (the terminal turns \n into \r\n), then "interrupted" has a line of its own
    assert out.endswith("\x1b[K\r\ninterrupted\r\n"), repr(out[-200:])
