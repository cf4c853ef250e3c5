"""Shared fixtures: an isolated MOONMIND_HOME, a small fixture repository, and the real CLI.

Everything here is real: the installed `moonmind` console script runs as a
subprocess, the embedded store is Qdrant Edge on disk, local mode is
qdrant-client's own engine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

MOONMIND = shutil.which("moonmind") or str(Path(sys.executable).parent / "moonmind")

#: Env vars that must never leak from the developer's shell into a test.
_SCRUB = (
    "QDRANT_URL", "QDRANT_API_KEY", "MOONMIND_HOME", "MOONMIND_COLLECTION", "MOONMIND_EMBEDDING_PROVIDER",
    "MOONMIND_EMBEDDING_MODEL", "MOONMIND_EMBEDDING_DIMENSIONS", "GOOGLE_API_KEY", "GOOGLE_EMBEDDING_MODEL",
    "OPENAI_API_KEY", "OPENAI_BASE_URL", "RAG_SIMILARITY_TOP_K", "RAG_SCORE_THRESHOLD", "MOONMIND_RUN_ID",
    "MOONMIND_JOB_ID", "MOONMIND_REPO", "MOONMIND_TENANT", "MOONMIND_RETRIEVAL_URL", "MOONMIND_RETRIEVAL_TOKEN",
    "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "MOONMIND_EVENTS_URL", "MOONMIND_EVENTS_TIMEOUT_S",
    "MOONMIND_SEARCH_QUEUE", "MOONMIND_INDEX_QUEUE", "MOONMIND_QUEUE_TIMEOUT_S", "MOONMIND_JOB_TASKS",
    "MOONMIND_BROKER_VISIBILITY_TIMEOUT_S", "MOONMIND_OVERLAY_SWEEP_INTERVAL_S", "STATSD_HOST", "STATSD_PORT",
    "MOONMIND_RAG_EXECUTION", "MOONMIND_ARTIFACTS_DIR", "MOONMIND_OWNER_IDLE_S", "MOONMIND_OWNER_MAX_RSS_MB",
    "MOONMIND_ROOT", "COHERE_API_KEY", "COHERE_BASE_URL",
)
#: Tests use an owner a test started (a worker, a gateway, `moonmind serve`) but never start one
#: by themselves, unless they say so (tests/test_owner_default.py): the default, a background owner
#: per MOONMIND_HOME, would outlive the test and hold the store its in-process checks open.
#: Nor does an owner watch the trees it indexed unless the test says so (tests/test_freshness.py): a test
#: that edits a file and runs `rag index` beside an owner counts what that run re-indexes.
OWNER_USE = {"MOONMIND_OWNER": "use", "MOONMIND_WATCH": "off"}
os.environ.update(OWNER_USE)  # every environment a test builds from this process's carries it

FIXTURE_FILES = {
    "auth/tokens.py": '''
        """Bearer token checks for the API."""

        import hmac


        def check_bearer_token(header: str, expected: str) -> bool:
            """Validate an `Authorization: Bearer <token>` header in constant time."""
            scheme, _, token = header.partition(" ")
            if scheme.lower() != "bearer":
                return False
            return hmac.compare_digest(token, expected)


        class TokenStore:
            """Keeps hashed API tokens and their scopes."""

            def __init__(self):
                self.tokens = {}

            def add(self, token_hash, scopes):
                self.tokens[token_hash] = scopes
        ''',
    "db/pool.py": '''
        """Database connection pooling."""


        class ConnectionPool:
            """A fixed-size pool of PostgreSQL connections with health checks."""

            def __init__(self, size: int = 10):
                self.size = size
                self.connections = []

            def acquire(self):
                """Borrow a connection from the pool, waiting when all are in use."""
                return self.connections.pop()

            def release(self, conn):
                """Return a connection to the pool."""
                self.connections.append(conn)
        ''',
    "docs/guide.md": '''
        # User guide

        ## Installation

        Install the package with pip and configure the database URL.

        ## Caching

        Responses are cached in Redis for five minutes; set CACHE_TTL to change it.
        ''',
    "web/render.js": '''
        export function renderTemplate(name, context) {
          // Render an HTML template with the given context object.
          return templates[name](context);
        }

        export class Router {
          constructor() { this.routes = []; }
          add(path, handler) { this.routes.push({ path, handler }); }
        }
        ''',
}


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    def json(self):
        return json.loads(self.stdout)

    def error(self) -> dict:
        """The JSON error envelope printed on stderr with --json."""
        return json.loads(self.stderr.strip().splitlines()[-1])["error"]


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for rel, content in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(content).lstrip("\n"))
    return root


#: When this session started, for the wall time the summary prints.
_SESSION_STARTED = time.monotonic()


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """The session's wall time beside the box's load, so a time is never read without what else ran."""
    one, five, fifteen = os.getloadavg()
    terminalreporter.write_line(f"wall {time.monotonic() - _SESSION_STARTED:.1f} s on {os.cpu_count()} cores, "
                                f"load average {one:.2f} {five:.2f} {fifteen:.2f} (1, 5, 15 min)")


@pytest.fixture
def home(tmp_path: Path) -> Path:
    h = tmp_path / "mmhome"
    h.mkdir()
    return h


@pytest.fixture
def env(home: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A clean environment for subprocesses and for in-process settings."""
    for key in _SCRUB:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MOONMIND_HOME", str(home))
    from moonmind_worker.settings import get_settings

    get_settings.cache_clear()
    monkeypatch.setenv("MOONMIND_OWNER", "use")
    e = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    e["MOONMIND_HOME"] = str(home)
    e.update(OWNER_USE)
    yield e
    get_settings.cache_clear()
    from moonmind_worker import runtime

    runtime.close_all()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return write_tree(tmp_path / "repo", FIXTURE_FILES)


@pytest.fixture
def cli(env: dict[str, str], tmp_path: Path):
    """Run the installed `moonmind` console script as a user would."""

    def run(*args: str, extra_env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 120) -> Result:
        e = dict(env)
        if extra_env:
            e.update(extra_env)
        p = subprocess.run(
            [MOONMIND, *args], capture_output=True, text=True, env=e, cwd=cwd or tmp_path, timeout=timeout
        )
        return Result(p.returncode, p.stdout, p.stderr)

    return run


@pytest.fixture
def invoke(env: dict[str, str], tmp_path: Path):
    """The CLI in this process (tests/cli_runner.py): `cli`'s arguments and Result, without a subprocess."""
    from cli_runner import CliRunner

    return CliRunner(env, tmp_path).invoke


@pytest.fixture
def indexed(cli, repo: Path):
    """The fixture repository indexed as repo=demo, tenant=acme."""
    r = cli("rag", "index", str(repo), "--repo", "demo", "--tenant", "acme")
    assert r.code == 0, r.stderr
    return repo

# ----------------------------------------------------------------- prebuilt ---
# The fixture repository indexed once per session, copied into each test's MOONMIND_HOME.
# Why: indexing through the CLI costs a process start per test; the guardrail, doctor,
# secrets and sync tests only need an already-indexed collection, which a copy of the
# embedded store's directory gives in milliseconds.


@pytest.fixture(scope="session")
def _index_template(tmp_path_factory) -> Path:
    from moonmind_worker.embedding import StaticEmbedder
    from moonmind_worker.indexing.indexer import index_repository
    from moonmind_worker.settings import Settings
    from moonmind_worker.store import EdgeStore

    root = tmp_path_factory.mktemp("prebuilt")
    repo = write_tree(root / "repo", FIXTURE_FILES)
    settings = Settings(moonmind_home=root / "home", qdrant_url=None, collection="moonmind__repo")
    store = EdgeStore(settings.data_dir, settings.collection)
    index_repository(repo, repo="demo", tenant="acme", settings=settings, embedder=StaticEmbedder(), store=store)
    store.close()
    return root


@pytest.fixture
def prebuilt(env, home: Path, tmp_path: Path, _index_template: Path) -> Path:
    """Like conftest's `indexed` (repo=demo, tenant=acme), without running the CLI; returns the repo root."""
    shutil.copytree(_index_template / "home" / "qdrant-edge", home / "qdrant-edge")
    (home / "qdrant-edge" / "moonmind__repo" / "owner.lock").unlink(missing_ok=True)
    return shutil.copytree(_index_template / "repo", tmp_path / "repo")
