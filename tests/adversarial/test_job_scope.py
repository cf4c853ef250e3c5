"""The trust model: a job's tenant and run are a ceiling on every transport; untrusted workers are gateway-only.

Issue 18 (minor): a job's exported MOONMIND_TENANT was only a default, so `--filters tenant=other`
read another tenant through the direct transport (spec 01 FR-006: scopes hold regardless of
transport).
Issue 32: the ceiling held only for search filters; now every operation × transport × widen/restate.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from moonmind_worker.errors import MoonmindError
from moonmind_worker.transports.queue_client import INDEX, SEARCH, run_task

from celery_helpers import BACKEND, BROKER, purge, queue_env, start_worker_process, stop, unique_queues, wait_for_consumer
from conftest import FIXTURE_FILES, MOONMIND, Result, write_tree
from gateway_helpers import clean_env, index_in_process, overlay_in_process
from http_servers import closed_port
from test_owner import start_owner

pytestmark = pytest.mark.slow

JOB = {"MOONMIND_JOB_ID": "job-1", "MOONMIND_RUN_ID": "run-1", "MOONMIND_REPO": "demo", "MOONMIND_TENANT": "acme"}


@pytest.fixture
def two_tenants(cli, indexed):
    r = cli("rag", "index", str(indexed), "--repo", "demo", "--tenant", "globex")
    assert r.code == 0, r.stderr
    return indexed


@pytest.mark.parametrize("flt", ["tenant=globex", "run_id=run-2", "tenant= globex "], ids=["tenant", "run", "padded"])
def test_a_job_cannot_widen_its_scope_with_filters(cli, two_tenants, flt):
    r = cli("rag", "search", "--query", "bearer token", "--filters", flt, "--json", extra_env=JOB)
    assert r.code == 4 and r.stdout == ""
    err = json.loads(r.stderr.strip().splitlines()[-1])["error"]
    assert err["code"] == "forbidden" and "would widen it" in err["message"]


def test_a_job_may_restate_its_own_scope_and_choose_another_repository(cli, two_tenants):
    r = cli("rag", "search", "--query", "bearer token", "--filters", "tenant=acme", "--json", extra_env=JOB)
    assert r.code == 0, r.stderr
    assert {i["payload"]["tenant"] for i in json.loads(r.stdout)["items"]} == {"acme"}
    other_repo = cli("rag", "search", "--query", "bearer token", "--filters", "repo=elsewhere", "--json", extra_env=JOB)
    assert other_repo.code == 0, other_repo.stderr


def test_outside_a_job_the_exported_tenant_is_only_a_default(cli, two_tenants):
    r = cli("rag", "search", "--query", "bearer token", "--filters", "tenant=globex", "--json",
            extra_env={"MOONMIND_TENANT": "acme"})
    assert r.code == 0, r.stderr
    assert {i["payload"]["tenant"] for i in json.loads(r.stdout)["items"]} == {"globex"}


def _start(cli, tmp_path, **env):
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"job_id": "job-9", "run_id": "run-9", "repo": "demo", "tenant": "acme", "capabilities": {}}))
    r = cli("job", "start", "--manifest", str(path), extra_env={"MOONMIND_EVENTS_URL": "", **env})
    return r, json.loads(path.read_text())


def test_a_gateway_only_worker_gets_no_rag_when_its_gateway_is_down(cli, indexed, tmp_path):
    dead = f"http://127.0.0.1:{closed_port()}"
    r, m = _start(cli, tmp_path, MOONMIND_RETRIEVAL_URL=dead, MOONMIND_RETRIEVAL_TOKEN="mmw_" + "t" * 43,
                  MOONMIND_RETRIEVAL_FALLBACK="none")
    assert r.code == 0
    assert "rag" not in m["capabilities"] and m["rag"]["reason"].startswith("gateway:")
    assert "MOONMIND_RETRIEVAL_FALLBACK=none" in m["rag"]["remedy"]


def test_a_worker_allowed_to_fall_back_resolves_to_direct_when_its_gateway_is_down(cli, indexed, tmp_path):
    dead = f"http://127.0.0.1:{closed_port()}"
    r, m = _start(cli, tmp_path, MOONMIND_RETRIEVAL_URL=dead, MOONMIND_RETRIEVAL_TOKEN="mmw_" + "t" * 43)
    assert r.code == 0
    assert m["capabilities"]["rag"] == "direct-qdrant"


# --- the ceiling matrix (issue 32): every operation × transport × widen / restate-or-narrow ---
# One store holds tenants acme and globex and runs run-1 (the job's) and run-2; the job is JOB.

#: Widening: another tenant or run through each operation's own flag. `{repo}` is the indexed tree.
WIDEN = {
    "search-tenant": ("rag", "search", "--query", "bearer token", "--filters", "tenant=globex"),
    "search-run": ("rag", "search", "--query", "bearer token", "--filters", "run_id=run-2"),
    "stats": ("rag", "stats", "--repo", "demo", "--tenant", "globex"),
    "packs": ("rag", "packs", "--run-id", "run-2"),
    "overlay-list": ("rag", "overlay", "list", "--run-id", "run-2"),
    "overlay-upsert-run": ("rag", "overlay", "upsert", "{repo}/auth/tokens.py", "--root", "{repo}", "--run-id", "run-2"),
    "overlay-upsert-tenant": ("rag", "overlay", "upsert", "{repo}/auth/tokens.py", "--root", "{repo}", "--tenant", "globex"),
    "overlay-clean": ("rag", "overlay", "clean", "--run-id", "run-2"),
    "index": ("rag", "index", "{repo}", "--repo", "demo", "--tenant", "globex"),
}
#: Restating the job's own tenant/run, or leaving it out, or choosing another repository of the tenant.
KEEP = {
    "search": ("rag", "search", "--query", "bearer token", "--filters", "tenant=acme", "run_id=run-1"),
    "stats": ("rag", "stats", "--repo", "demo", "--tenant", "acme"),
    "stats-default": ("rag", "stats", "--repo", "demo"),
    "packs": ("rag", "packs", "--run-id", "run-1"),
    "overlay-list": ("rag", "overlay", "list"),
    "overlay-upsert": ("rag", "overlay", "upsert", "{repo}/auth/tokens.py", "--root", "{repo}", "--run-id", "run-1",
                       "--tenant", "acme"),
    "overlay-clean": ("rag", "overlay", "clean", "--run-id", "run-1"),
    "index": ("rag", "index", "{repo}", "--repo", "demo", "--tenant", "acme"),
    "index-other-repo": ("rag", "index", "{repo}", "--repo", "elsewhere"),
    "eval": ("rag", "eval", "--queries", "{queries}", "--repo", "demo"),
}


class World:
    def __init__(self, base, home, repo, env):
        self.base, self.home, self.repo, self.env = base, home, repo, env

    def args(self, template):
        return [a.format(repo=self.repo, queries=self.base / "queries.json") for a in template]

    def run(self, *args, extra_env=None, timeout=120):
        p = subprocess.run([MOONMIND, *args], capture_output=True, text=True, env={**self.env, **(extra_env or {})},
                           cwd=self.base, timeout=timeout)
        return Result(p.returncode, p.stdout, p.stderr)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    base = tmp_path_factory.mktemp("ceiling")
    repo = write_tree(base / "repo", FIXTURE_FILES)
    home = base / "home"
    home.mkdir()
    index_in_process(home, repo, [("demo", "acme"), ("demo", "globex")])
    overlay_in_process(home, repo, ["auth/tokens.py"], [("run-2", "demo", "acme"), ("run-2", "demo", "globex")])
    (base / "queries.json").write_text(json.dumps([{"query": "bearer token", "relevant": ["auth/tokens.py"]}]))
    w = World(base, home, repo, clean_env(home))
    r = w.run("rag", "search", "--query", "bearer token", extra_env={"MOONMIND_RUN_ID": "run-2"})  # run-2's cached pack
    assert r.code == 0, r.stderr
    return w


@pytest.fixture(scope="module", params=["one-shot", "owner"])
def via(request, world):
    """The CLI in a job runs each operation itself, or sends it to the box's owner (with its own settings)."""
    if request.param == "one-shot":
        yield request.param
        return
    proc = start_owner(world.env, world.home)
    try:
        yield request.param
    finally:
        stop(proc)


@pytest.mark.parametrize("op", list(WIDEN))
def test_no_operation_widens_the_jobs_scope(world, via, op):
    r = world.run(*world.args(WIDEN[op]), "--json", extra_env=JOB)
    assert r.code == 4 and r.stdout == "", (r.code, r.stdout, r.stderr)
    err = r.error()
    assert err["code"] == "forbidden" and "would widen it" in err["message"], err


@pytest.mark.parametrize("op", list(KEEP))
def test_every_operation_may_restate_or_narrow_the_jobs_scope(world, via, op):
    r = world.run(*world.args(KEEP[op]), "--json", extra_env=JOB)
    assert r.code == 0, r.stderr
    if op.startswith("stats"):
        assert r.json()["tenant"] == "acme"
    elif op == "overlay-list":
        assert {(row["run_id"], row["tenant"]) for row in r.json()} <= {("run-1", "acme")}


#: Requests a client builds itself (an older CLI, a script on the owner's socket): no CLI check in front.
OPS_WIDEN = {
    "search": {"query": {"query": "bearer token", "filters": {"tenant": "globex"}}},
    "stats": {"repo": "demo", "tenant": "globex", "root": None},
    "overlay_list": {"run_id": "run-2"},
    "overlay_clean": {"run_id": "run-2", "expired": False},
    "index": {"path": "{repo}", "repo": "demo", "tenant": "globex"},
}


@pytest.mark.parametrize("op", list(OPS_WIDEN))
def test_an_operation_requested_without_the_cli_is_confined_where_it_runs(world, via, op):
    from moonmind_worker.owner.dispatch import execute
    from moonmind_worker.settings import Settings

    settings = Settings(_env_file=None, _environ=False, moonmind_home=str(world.home), owner_mode="use",
                        job_id="job-1", run_id="run-1", repo="demo", tenant="acme")
    args = {k: (v.format(repo=world.repo) if isinstance(v, str) else v) for k, v in OPS_WIDEN[op].items()}
    try:
        with pytest.raises(MoonmindError) as err:
            execute(settings, op, args)
    finally:
        from moonmind_worker import runtime

        runtime.close_all()  # one-shot: the store this process may have opened goes back to the module's commands
    assert err.value.code == "forbidden" and "would widen it" in err.value.message


def test_the_mcp_tools_offer_no_argument_the_jobs_scope_fixes_and_refuse_one_sent_anyway(world):
    from test_mcp import call, envelope

    listing, *widened, restated = call(
        {**world.env, **JOB}, world.base,
        ("list", None),
        ("stats", {"repo": "demo", "tenant": "globex"}),
        ("index", {"path": str(world.repo), "repo": "demo", "tenant": "globex"}),
        ("overlay_upsert", {"paths": ["auth/tokens.py"], "root": str(world.repo), "run_id": "run-2"}),
        ("overlay_upsert", {"paths": ["auth/tokens.py"], "root": str(world.repo), "tenant": "globex"}),
        ("search", {"query": "bearer token", "filters": {"tenant": "globex"}}),
        ("stats", {"repo": "demo", "tenant": "acme"}),
    )
    schemas = {t.name: t.input_schema["properties"] for t in listing.tools}
    assert "tenant" not in schemas["stats"] and "tenant" not in schemas["index"]
    assert not {"tenant", "run_id"} & set(schemas["overlay_upsert"])
    assert not {"tenant", "run_id"} & set(schemas["search"]["filters"]["properties"])
    for result in widened:
        err = envelope(result)
        assert err["code"] == "forbidden" and "would widen it" in err["message"], err
    assert not restated.is_error and restated.structured_content["tenant"] == "acme"


QUEUE_WIDEN = ("search-tenant", "index", "overlay-upsert-run", "overlay-clean")


def test_through_a_queue_the_ceiling_holds_in_the_cli_and_again_on_the_worker(cli, two_tenants, env, tmp_path):
    """Its own store (a worker owns the store it serves; the module's owner keeps the shared one)."""
    sq, iq = unique_queues()
    qenv = queue_env(env, sq, iq)
    proc = start_worker_process(qenv, [sq, iq], tmp_path / "worker.log")
    fill = World(tmp_path, None, two_tenants, qenv).args
    try:
        wait_for_consumer(sq, proc=proc)
        wait_for_consumer(iq, proc=proc)
        job = {**qenv, **JOB}
        for op in QUEUE_WIDEN:
            r = cli(*fill(WIDEN[op]), "--execution", "queue", "--json", extra_env=job)
            assert r.code == 4 and r.error()["code"] == "forbidden", (op, r.stderr)
        for op in ("search", "index"):
            r = cli(*fill(KEEP[op]), "--execution", "queue", "--json", extra_env=job)
            assert r.code == 0, (op, r.stderr)
        # a task that carries the job's scope but asks for more is refused by the worker itself
        scope = {"job_id": "job-1", "tenant": "acme", "run_id": "run-1"}
        for task, kwargs, queue in (
            (INDEX, {"request": {"path": str(two_tenants), "repo": "demo", "tenant": "globex"}}, iq),
            (SEARCH, {"query": {"query": "bearer token", "filters": {"tenant": "globex"}}}, sq),
        ):
            with pytest.raises(MoonmindError) as err:
                run_task(task, {**kwargs, "scope": scope}, queue=queue, broker_url=BROKER, backend_url=BACKEND, timeout_s=60)
            assert err.value.code == "forbidden" and "would widen it" in err.value.message
    finally:
        stop(proc)
        purge(sq, iq)
