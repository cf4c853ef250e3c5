"""The trust model: a job's tenant and run are a ceiling on every transport; untrusted workers are gateway-only.

Issue 18 (minor): a job's exported MOONMIND_TENANT was only a default, so `--filters tenant=other`
read another tenant through the direct transport (spec 01 FR-006: scopes hold regardless of
transport).
"""

from __future__ import annotations

import json

import pytest

from http_servers import closed_port

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
