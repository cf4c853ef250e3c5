"""Canaries (issue 52): a tree seeded with secrets of 20 kinds, indexed through every entry point; 0 canaries out.

The tree (canaries.py) holds 8 secret files and 12 source files with a secret written inline. It is
indexed, overlaid and searched through the one-shot CLI, the box's owner (with its watcher), the
RetrievalGateway, the MCP server and a Celery worker, each in a home of its own. Then every output is
scanned for the canaries: stdout and stderr of each command, each JSON answer, the queue events and
StatsD datagrams sent meanwhile, the logs, the task results in the result backend, and every file
under MOONMIND_HOME (the store, the owner's log, cached packs and breadcrumbs; also while the gateway
serves). The store's payload pages are compressed (a canary can hide behind a back-reference
there), so every stored payload is also read back through the store and scanned as text.

Each scenario runs twice: on the tree as seeded, where the secret files are left out by their names,
and on the same tree in a git repository whose secret files only the user's core.excludesFile ignores,
with MOONMIND_INDEX_SECRET_FILES=on so that the name rule cannot hide a failure of the excludes rule.

The searches would surface the secrets: the words an attacker (or an agent) would ask for, and every
canary itself, lowercased: the same terms to the lexical index (it folds case) and to the uncased
static model, while the pack's echo of the query never holds a canary (found_in is case-sensitive).
One search of every canary at once with `--top-k 50 --score-threshold 0` returns every chunk stored.
The last tests check the checks: with the protections off, the same scans find every canary.

Everything is real: the installed console script, `moonmind serve`/the auto owner, `moonmind gateway
serve`, `moonmind mcp` over stdio, `celery -A tasks worker` on Redis, events on Redis, StatsD on UDP.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import anyio
import pytest
from canaries import INLINE_SECRETS, PLAIN, SECRET_FILES, canaries, found_in, seed
from test_freshness import owner_call, settled, until
from test_observability import BROKER as EVENTS_URL
from test_observability import EventConsumer
from test_owner_default import SERVED_ONLY, alive, cmdline, lock_pid

from celery_helpers import BACKEND, purge, queue_env, redis, start_worker_process, stop, unique_queues, wait_for_consumer
from conftest import MOONMIND, Result
from gateway_helpers import add_token, clean_env, start_gateway

REPO = "shop"
TENANT = "default"
RUN = "run-canary"
#: What one would ask to find the secrets.
PROBES = ("OPENSSH PRIVATE KEY", "OPENAI_API_KEY", "SECRET_KEY", "aws access key", "database password")
#: Every canary at once, lowercased (see the module's docstring).
EVERYTHING = " ".join(c.lower() for c in canaries())
#: Every chunk of the repository: nothing cut by score, and more room than the ~30 chunks a scenario stores.
ALL_CHUNKS = {"query": EVERYTHING, "top_k": 50, "score_threshold": 0.0, "filters": {"repo": REPO}}
#: Every chunk the run sees: its overlay in place of the canonical chunks of the files it holds.
ALL_CHUNKS_OF_RUN = {**ALL_CHUNKS, "filters": {"repo": REPO, "run_id": RUN}}
#: The searches of every scenario: the probes, then everything stored.
QUERIES = [*({"query": q, "top_k": 10, "filters": {"repo": REPO}} for q in PROBES), ALL_CHUNKS, ALL_CHUNKS_OF_RUN]
SECRET_PATHS = sorted(path for path, _ in SECRET_FILES.values())
INDEXED_PATHS = sorted([*(path for path, _ in INLINE_SECRETS.values()), *PLAIN])
#: Every file of the tree, the secret files included: an overlay names them all explicitly.
ALL_PATHS = sorted([*SECRET_PATHS, *INDEXED_PATHS])
#: The user's core.excludesFile in the excludes scenario: patterns as people write them.
EXCLUDES = ".env\n*.env\nid_rsa\n*.pem\ncredentials.json\n.aws/\n*.tfstate\n.netrc\n"
#: The secret file the owner's watcher sees appear (a canary no inline rule redacts: only leaving it out keeps it in).
WATCHED_SECRET = ("infra/staging.tfstate", SECRET_FILES["terraform state"][1])
WATCHED_EDIT = "app/gh.py"
WATCHED_LINE = "# rotated by the watcher scenario\n"
SETTING = "MOONMIND_INDEX_SECRET_FILES=on"
WAIT_S = 120.0  # how long a poll may take before the scenario is called broken (no time is asserted with it)


# ------------------------------------------------------------------ a scenario's record ---


@dataclass
class Outcome:
    """What one entry point did with the tree, and everything it said or wrote on the way."""

    entry: str
    excludes: bool
    base: Path
    home: Path
    tree: Path
    env: dict[str, str]
    report: dict[str, Any] = field(default_factory=dict)  # the index report, as the entry point answered it
    overlay: dict[str, Any] = field(default_factory=dict)  # the overlay upsert's summary
    packs: list[dict[str, Any]] = field(default_factory=list)  # every ContextPack answered
    texts: list[str] = field(default_factory=list)  # every output: stdout, stderr, answers, events, results
    paths: list[Path] = field(default_factory=list)  # files and folders to scan besides MOONMIND_HOME
    live_hits: list[str] = field(default_factory=list)  # canaries found while a process ran (its files go with it)
    stored: list[dict[str, Any]] = field(default_factory=list)  # every stored payload, read back at the end
    searches: int = 0

    def mm(self, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> Result:
        """Run the `moonmind` console script; its outputs are kept for the scan and it must succeed."""
        p = subprocess.run([MOONMIND, *args], capture_output=True, text=True, env=env or self.env, cwd=cwd or self.tree,
                           timeout=180)
        self.texts += [p.stdout, p.stderr]
        assert p.returncode == 0, (args, p.stdout[-2000:], p.stderr[-2000:])
        return Result(p.returncode, p.stdout, p.stderr)

    def pack(self, pack: dict[str, Any]) -> dict[str, Any]:
        self.packs.append(pack)
        self.searches += 1
        return pack

    def hits(self) -> list[str]:
        """Every canary found anywhere this scenario reached."""
        stored = tuple(json.dumps(p) for p in self.stored)
        return self.live_hits + found_in([self.home, *self.paths], (*self.texts, *stored))

    def items(self, trust_class: str) -> list[dict[str, Any]]:
        return [i for p in self.packs for i in p["items"] if i["trust_class"] == trust_class]


def cli_search_args(q: dict[str, Any]) -> list[str]:
    args = ["rag", "search", "--query", q["query"], "--top-k", str(q["top_k"]), "--filters",
            *(f"{k}={v}" for k, v in q["filters"].items())]
    if "score_threshold" in q:
        args += ["--score-threshold", str(q["score_threshold"])]
    return args


def stored_payloads(home: Path) -> list[dict[str, Any]]:
    """Every point's payload in the embedded store at `home`, read through the store (no process may hold it)."""
    from moonmind_worker.settings import Settings
    from moonmind_worker.store import open_store

    store = open_store(Settings(_env_file=None, moonmind_home=home, qdrant_url=None, collection="moonmind__repo"))
    try:
        return [h.payload for h in store.scroll(None, True)]
    finally:
        store.close()


class Sinks:
    """A StatsD server (a UDP socket) and a queue-event consumer, for the length of one scenario."""

    def __init__(self) -> None:
        self.statsd = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.statsd.bind(("127.0.0.1", 0))
        self.statsd.setblocking(False)
        self.events = EventConsumer()
        self.received: list[dict[str, Any]] = []
        self.env = {"STATSD_HOST": "127.0.0.1", "STATSD_PORT": str(self.statsd.getsockname()[1]),
                    "MOONMIND_EVENTS_URL": EVENTS_URL}

    def collect(self, o: Outcome) -> None:
        """The events of the scenario's index, overlay and searches (wherever they ran), and every datagram."""

        def arrived() -> bool:
            while (m := self.events.bound.get(no_ack=True)) is not None:
                self.received.append(m.payload)
            ours = Counter(e["event"] for e in self.received if e.get("repo") == REPO)
            return (ours["repository_indexed"] >= 1 and ours["overlay_upserted"] >= 1
                    and ours["qdrant_query_completed"] >= o.searches)

        until(arrived, WAIT_S, "the scenario's queue events")
        o.texts += [json.dumps(e) for e in self.received]
        while True:
            try:
                o.texts.append(self.statsd.recv(65535).decode("ascii", "replace"))
            except BlockingIOError:
                break

    def close(self) -> None:
        self.statsd.close()
        self.events.close()


def prepare(base: Path, entry: str, excludes: bool, sinks: Sinks) -> Outcome:
    """The seeded tree and a home of its own; git isolated from the user's own configuration."""
    home = base / "home"
    home.mkdir()
    tree = seed(base / "tree")
    gitconfig = base / "gitconfig"
    extra = {"GIT_CONFIG_GLOBAL": str(gitconfig), "GIT_CONFIG_NOSYSTEM": "1", "XDG_CONFIG_HOME": str(base / "xdg"),
             **sinks.env}
    if excludes:
        (base / "excludes").write_text(EXCLUDES)
        gitconfig.write_text(f"[core]\n\texcludesFile = {base / 'excludes'}\n")
        extra["MOONMIND_INDEX_SECRET_FILES"] = "on"  # the name rule is off: only the excludes file leaves them out
    else:
        gitconfig.write_text("")
    env = clean_env(home, **extra)
    if excludes:
        subprocess.run(["git", "init", "-q", str(tree)], check=True, env=env)
        ignored = subprocess.run(["git", "-C", str(tree), "ls-files", "--others", "--ignored", "--exclude-standard"],
                                 capture_output=True, text=True, check=True, env=env).stdout.split()
        assert sorted(ignored) == SECRET_PATHS, "git itself must ignore exactly the secret files"
    return Outcome(entry, excludes, base, home, tree, env)


# ------------------------------------------------------------------- the entry points ---


def through_cli(o: Outcome) -> None:
    """One-shot commands (MOONMIND_OWNER=off), run from inside the tree as a user would (`related`, `symbols`
    and `stats` are the owner's, the gateway's and the MCP server's to answer below)."""
    e = {**o.env, "MOONMIND_OWNER": "off"}
    o.mm("rag", "index", ".", "--repo", REPO, "--dry-run", "--json", env=e)
    o.report = o.mm("rag", "index", ".", "--repo", REPO, "--json", env=e).json()
    o.overlay = o.mm("rag", "overlay", "upsert", *ALL_PATHS, "--root", ".", "--run-id", RUN, "--repo", REPO, "--json",
                     env=e).json()
    o.mm("rag", "index", ".", "--repo", REPO, env=e)  # the summary line and its notes (a run with nothing new)
    for q in QUERIES:
        o.pack(o.mm(*cli_search_args(q), "--json", env=e).json())
    out = o.base / "pack.md"  # the full context block, as an agent pastes it
    o.mm(*cli_search_args(ALL_CHUNKS_OF_RUN), "--output-file", str(out), env=e)
    o.paths.append(out)
    o.mm("rag", "packs", "--json", env=e)
    o.mm("worker", "doctor", env=e)  # reads the tree's .env as its settings file: it must not print a value


def through_owner(o: Outcome) -> None:
    """The default: the first command starts the box's owner (its log in MOONMIND_HOME), which serves the rest
    and watches the tree; a secret file appearing and an inline secret edited are re-indexed by its watcher."""
    e = {**o.env, "MOONMIND_OWNER": "auto", "MOONMIND_WATCH": "on"}
    served = {**e, **SERVED_ONLY}  # a command that can only succeed through the owner
    o.report = o.mm("rag", "index", ".", "--repo", REPO, "--json", env=e).json()
    pid = lock_pid(o.home)
    try:
        assert pid and "serve --idle-exit" in cmdline(pid), "the index was not run by an auto-started owner"
        o.overlay = o.mm("rag", "overlay", "upsert", *ALL_PATHS, "--root", ".", "--run-id", RUN, "--repo", REPO, "--json",
                         env=served).json()
        until(lambda: settled(o.home), WAIT_S, "the watcher's first pass")
        (o.tree / WATCHED_SECRET[0]).write_text(WATCHED_SECRET[1])
        with open(o.tree / WATCHED_EDIT, "a") as f:
            f.write(WATCHED_LINE)
        seen = {"query": "rotated watcher github token", "filters": {"repo": REPO}, "top_k": 20, "score_threshold": 0.0}
        until(lambda: any(WATCHED_LINE.strip() in i["text"] for i in owner_call(o.home, "search", {"query": seen,
                          "record": False})["items"]), WAIT_S, "the watcher's re-index of the edit")
        until(lambda: settled(o.home), WAIT_S, "the watcher's pass to end")
        for q in QUERIES:
            o.pack(o.mm(*cli_search_args(q), "--json", env=served).json())
        o.mm(*cli_search_args(QUERIES[0]), env=served)
        o.mm("rag", "related", "app/aws.py", "--repo", REPO, "--json", env=served)
        o.mm("rag", "stats", "--repo", REPO, "--json", env=served)
        assert lock_pid(o.home) == pid  # one owner served them all
    finally:
        if pid and alive(pid) and "--idle-exit" in cmdline(pid):
            os.kill(pid, signal.SIGTERM)
            until(lambda: not alive(pid), 30, "the owner's exit")
    assert (o.home / "owner.log").exists()


def through_gateway(o: Outcome) -> None:
    """Indexed and overlaid by the CLI, then searched over HTTP and by the CLI's gateway transport."""
    e = {**o.env, "MOONMIND_OWNER": "off"}
    o.report = o.mm("rag", "index", str(o.tree), "--repo", REPO, "--json", env=e, cwd=o.base).json()
    o.overlay = o.mm("rag", "overlay", "upsert", *(str(o.tree / p) for p in ALL_PATHS), "--root", str(o.tree), "--run-id",
                     RUN, "--repo", REPO, "--json", env=e, cwd=o.base).json()
    token = add_token(e, "canary", [REPO], [TENANT])
    gw = start_gateway(o.home, e, o.base, "--workers", "2")  # two workers: each searches a replica of the store
    o.paths.append(gw.log)
    try:
        with gw.client(token) as c:
            for q in QUERIES:
                r = c.post("/retrieval/context", json=q)
                o.texts.append(r.text)
                assert r.status_code == 200, r.text
                o.pack(r.json())
            for path, body in (("/retrieval/related", {"query": "app/aws.py", "filters": {"repo": REPO}}),
                               ("/retrieval/symbols", {"query": "client", "filters": {"repo": REPO}})):
                r = c.post(path, json=body)
                o.texts.append(r.text)
                assert r.status_code == 200, r.text
            for path in ("/retrieval/status", "/retrieval/status.html", "/retrieval/health"):
                o.texts.append(c.get(path).text)
        via = {**e, "MOONMIND_RETRIEVAL_URL": gw.url, "MOONMIND_RETRIEVAL_TOKEN": token, "MOONMIND_RETRIEVAL_FALLBACK": "none"}
        pack = o.pack(o.mm(*cli_search_args(ALL_CHUNKS_OF_RUN), "--json", env=via, cwd=o.base).json())
        assert pack["transport"] == "gateway"
        replicas = o.home / "gateway-replicas"
        assert replicas.is_dir() and any(p.is_file() for p in replicas.rglob("*")), "no replica to scan"
        o.live_hits += found_in(o.home)  # while it serves: the replicas go when it stops
    finally:
        gw.stop()


def through_mcp(o: Outcome) -> None:
    """`moonmind mcp` over stdio: its index, overlay_upsert, search, related, symbols and stats tools."""
    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client

    e = {**o.env, "MOONMIND_OWNER": "off"}
    calls: list[tuple[str, dict[str, Any]]] = [
        ("index", {"path": str(o.tree), "repo": REPO}),
        ("overlay_upsert", {"paths": ALL_PATHS, "root": str(o.tree), "run_id": RUN, "repo": REPO, "tenant": TENANT}),
        *(("search", q) for q in QUERIES),
        ("related", {"location": "app/aws.py", "filters": {"repo": REPO}}),
        ("symbols", {"name": "client", "filters": {"repo": REPO}}),
        ("stats", {"repo": REPO}),
    ]
    logged: list[str] = []

    async def on_log(params: Any) -> None:
        logged.append(str(params))

    async def session() -> list[Any]:
        params = StdioServerParameters(command=MOONMIND, args=["mcp"], env=e, cwd=str(o.base))
        with open(o.base / "mcp-stderr.log", "w") as errlog:
            async with Client(stdio_client(params, errlog=errlog), read_timeout_seconds=120, logging_callback=on_log) as c:
                return [await c.call_tool(name, args) for name, args in calls]

    results = anyio.run(session)
    o.paths.append(o.base / "mcp-stderr.log")
    o.texts += logged
    for (name, _), result in zip(calls, results):
        o.texts += [c.text for c in result.content if hasattr(c, "text")] + [json.dumps(result.structured_content)]
        assert not result.is_error, (name, result.content)
        if name == "search":
            o.pack(result.structured_content)
    o.report, o.overlay = results[0].structured_content, results[1].structured_content


def through_celery(o: Outcome) -> None:
    """A real worker on Redis runs the tasks the CLI sends (`--execution queue`): the index and the overlay sent
    with `--no-wait` and read back by `task status` (their results stay in the result backend), the searches waited for."""
    sq, iq = unique_queues()
    e = queue_env(o.env, sq, iq)
    log = o.base / "worker.log"
    proc = start_worker_process(e, [sq, iq], log)

    def finished(*command: str) -> dict[str, Any]:
        task_id = o.mm(*command, "--execution", "queue", "--no-wait", env=e, cwd=o.base).stdout.strip()
        status = until(lambda: (st := o.mm("task", "status", task_id, "--json", env=e, cwd=o.base).json())["state"]
                       not in ("PENDING", "STARTED", "PROGRESS") and st, WAIT_S, f"the task {task_id}")
        assert status["state"] == "SUCCESS", status
        return status["result"]

    try:
        wait_for_consumer(iq, proc=proc)
        wait_for_consumer(sq, proc=proc)
        o.report = finished("rag", "index", str(o.tree), "--repo", REPO)
        o.overlay = finished("rag", "overlay", "upsert", *(str(o.tree / p) for p in ALL_PATHS), "--root", str(o.tree),
                             "--run-id", RUN, "--repo", REPO)
        for q in QUERIES:
            o.pack(o.mm(*cli_search_args(q), "--json", "--execution", "queue", "--timeout", "120", env=e, cwd=o.base).json())
    finally:
        stop(proc)
        purge(sq, iq)
    o.paths.append(log)
    ids = set(re.findall(r"moonmind\.rag\.\w+\[([0-9a-f-]{36})\]", log.read_text()))
    assert len(ids) == 2 + len(QUERIES), "the worker's log names every task it ran"
    backend = redis(int(BACKEND.rsplit("/", 1)[1]))
    results = [raw.decode("utf-8", "replace") for i in sorted(ids) if (raw := backend.get(f"celery-task-meta-{i}"))]
    assert len(results) == 2, "the waited-for results are forgotten once read; the two read by `task status` remain"
    o.texts += results


ENTRIES: dict[str, Callable[[Outcome], None]] = {
    "cli": through_cli, "owner": through_owner, "gateway": through_gateway, "mcp": through_mcp, "celery": through_celery,
}


def run_scenario(tmp_path_factory: pytest.TempPathFactory, entry: str, excludes: bool) -> Outcome:
    sinks = Sinks()
    try:
        o = prepare(tmp_path_factory.mktemp(f"canaries-{entry}-{'excludes' if excludes else 'named'}"), entry, excludes,
                    sinks)
        ENTRIES[entry](o)
        sinks.collect(o)
    finally:
        sinks.close()
    o.stored = stored_payloads(o.home)
    return o


@pytest.fixture(scope="module", params=[pytest.param(e, marks=pytest.mark.slow) for e in ENTRIES])
def outcome(request, tmp_path_factory) -> Outcome:
    """The tree as seeded, through one entry point: its secret files are known by their names."""
    return run_scenario(tmp_path_factory, request.param, excludes=False)


@pytest.fixture(scope="module", params=[pytest.param(e, marks=pytest.mark.slow) for e in ENTRIES])
def excluded(request, tmp_path_factory) -> Outcome:
    """The tree in a git repository whose secret files only the user's core.excludesFile ignores."""
    return run_scenario(tmp_path_factory, request.param, excludes=True)


# ------------------------------------------------------------------------ the scenarios ---


def test_no_canary_is_found_in_any_output_event_log_pack_or_store_file(outcome):
    """Every output, event, datagram, log, task result, pack, breadcrumb and store file: 0 canaries."""
    assert outcome.hits() == []


def test_every_secret_file_is_reported_skipped_with_the_setting_that_indexes_it(outcome):
    """The index report lists each secret file as skipped, the reason naming MOONMIND_INDEX_SECRET_FILES=on."""
    reasons = {s["path"]: s["reason"] for s in outcome.report["skipped"]}
    assert sorted(reasons) == SECRET_PATHS
    assert all(r.startswith("secret file: ") and SETTING in r for r in reasons.values()), reasons
    assert outcome.report["files_indexed"] == len(INDEXED_PATHS)


def test_every_inline_secret_file_is_indexed_and_answers_with_its_redaction_marker(outcome):
    """A search returns each of the 12 files holding an inline secret, its secret replaced by `[redacted: KIND]`."""
    assert_redacted(outcome.items("canonical"))
    assert {p["path"] for p in outcome.stored} == set(INDEXED_PATHS)


def test_an_overlay_naming_the_secret_files_skips_them_and_redacts_the_inline_secrets(outcome):
    """`overlay upsert` of every file, secret files named explicitly: those are refused, the rest redacted."""
    skipped = {s["path"]: s["reason"] for s in outcome.overlay["skipped"]}
    assert sorted(skipped) == SECRET_PATHS and all(SETTING in r for r in skipped.values()), skipped
    assert sorted(outcome.overlay["files"]) == INDEXED_PATHS
    assert_redacted(outcome.items("overlay"))
    assert {p["path"] for p in outcome.stored if p["trust_class"] != "canonical"} == set(INDEXED_PATHS)


def test_no_canary_is_found_when_only_core_excludes_file_ignores_the_secret_files(excluded):
    """The same scan on the git tree, secret files allowed by name but ignored by core.excludesFile: 0 canaries."""
    assert excluded.hits() == []


def test_the_files_core_excludes_file_ignores_are_neither_indexed_nor_overlaid(excluded):
    """The name rule is off (nothing is skipped as a secret file), and still no ignored file reaches the store."""
    assert not any("secret file" in s["reason"] for s in excluded.report["skipped"])
    assert excluded.report["files_indexed"] == len(INDEXED_PATHS)
    assert {p["path"] for p in excluded.stored} == set(INDEXED_PATHS)
    skipped = {s["path"]: s["reason"] for s in excluded.overlay["skipped"]}
    assert sorted(skipped) == SECRET_PATHS and all("ignored" in r for r in skipped.values()), skipped


def test_inline_secrets_are_still_redacted_in_the_git_tree(excluded):
    """With the excludes rule doing the files' part, redaction still does the inline part, canonical and overlay."""
    assert_redacted(excluded.items("canonical"))
    assert_redacted(excluded.items("overlay"))


def assert_redacted(items: list[dict[str, Any]]) -> None:
    by_source: dict[str, str] = {}
    for i in items:
        by_source[i["source"]] = by_source.get(i["source"], "") + i["text"]
    for kind, (path, _text) in INLINE_SECRETS.items():
        assert f"[redacted: {kind}]" in by_source.get(path, ""), (kind, path, sorted(by_source))


# ------------------------------------------------------------------- the checks checked ---


@pytest.mark.slow
def test_with_the_protections_off_the_same_scans_find_every_canary(invoke, home, tmp_path):
    """Secret files indexed and nothing redacted: the store read-back, the home scan and the search find all 20."""
    tree = seed(tmp_path / "tree")
    off = {"MOONMIND_OWNER": "off", "MOONMIND_INDEX_SECRET_FILES": "on", "MOONMIND_REDACT_SECRETS": "off",
           "GIT_CONFIG_GLOBAL": str(tmp_path / "no-gitconfig"), "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    assert invoke("rag", "index", str(tree), "--repo", REPO, extra_env=off).code == 0
    everything = invoke(*cli_search_args(ALL_CHUNKS), "--json", extra_env=off)
    assert everything.code == 0, everything.stderr
    found = {hit.split(" @ ")[0] for hit in found_in(home, (everything.stdout, *map(json.dumps, stored_payloads(home))))}
    assert found == set(canaries())
    in_search = {hit.split(" @ ")[0] for hit in found_in([], (everything.stdout,))}
    assert in_search == set(canaries()), "one search of every canary returns every secret stored"


@pytest.mark.slow
def test_without_its_excludes_file_the_git_tree_would_let_secret_file_canaries_through(invoke, home, tmp_path):
    """The excludes scenario's 0 is the excludes file's doing: without it, MOONMIND_INDEX_SECRET_FILES=on leaks."""
    tree = seed(tmp_path / "tree")
    allowed = {"MOONMIND_OWNER": "off", "MOONMIND_INDEX_SECRET_FILES": "on",
               "GIT_CONFIG_GLOBAL": str(tmp_path / "no-gitconfig"), "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    subprocess.run(["git", "init", "-q", str(tree)], check=True, env={**os.environ, **allowed})
    assert invoke("rag", "index", str(tree), "--repo", REPO, extra_env=allowed).code == 0
    found = {hit.split(" @ ")[0] for hit in found_in([], tuple(map(json.dumps, stored_payloads(home))))}
    in_secret_files = {c for c in canaries() if any(c in text for _path, text in SECRET_FILES.values())}
    assert found and found <= in_secret_files, found


def test_the_scenarios_cover_twenty_kinds_of_secret():
    """At least 12 kinds, as files and inline: 8 secret files and 12 inline secrets, each with its own canary."""
    assert len(SECRET_FILES) + len(INLINE_SECRETS) == len(set(canaries())) == 20


def test_queries_never_hold_a_canary_themselves():
    """A pack echoes its query: the probes are chosen so that an echo can never be mistaken for a leak."""
    assert found_in([], tuple(q["query"] for q in QUERIES)) == []
