"""compose/docker-compose.yml, checked statically (no Docker engine here): it parses, has the whole
stack with health checks, every command names a real entry point, every variable is one the settings read."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

COMPOSE = Path(__file__).resolve().parent.parent / "compose" / "docker-compose.yml"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def _argv(command) -> list[str]:
    return list(command) if isinstance(command, list) else shlex.split(command)


def _settings_env_names() -> set[str]:
    from moonmind_worker.settings import Settings

    names: set[str] = set()
    for field in Settings.model_fields.values():
        names.update(field.aliases)
    return names


def test_the_file_has_the_whole_stack_each_with_a_health_check(compose):
    services = compose["services"]
    assert {"qdrant", "redis", "worker", "beat", "gateway"} <= set(services)
    for name, svc in services.items():
        assert svc.get("healthcheck", {}).get("test"), f"{name} has no health check"


def test_every_moonmind_and_celery_command_names_a_real_entry_point(compose):
    from moonmind_worker.cli.main import build_parser

    checked = 0
    for name, svc in compose["services"].items():
        for argv in [_argv(svc["command"])] if "command" in svc else []:
            if argv[0] == "moonmind":
                args = build_parser().parse_args(argv[1:])
                assert getattr(args, "_handler", None) is not None, f"{name}: {argv} is not a command"
                checked += 1
            elif argv[0] == "celery":
                assert argv[1:3] == ["-A", "tasks"] and argv[3] in ("worker", "beat"), argv
                import tasks

                assert tasks.app.main == "moonmind"
                from celery.bin.celery import celery as celery_cli

                assert argv[3] in celery_cli.commands
                checked += 1
    assert checked >= 3  # worker, beat, gateway


def test_the_worker_consumes_both_queues_and_may_use_many_processes_on_the_qdrant_server(compose):
    from moonmind_worker.settings import Settings
    from tasks.celeryapp import embedded_store_refusal

    svc = compose["services"]["worker"]
    argv = _argv(svc["command"])
    queues = [svc["environment"]["MOONMIND_SEARCH_QUEUE"], svc["environment"]["MOONMIND_INDEX_QUEUE"]]
    assert argv[argv.index("-Q") + 1].split(",") == queues
    settings = Settings(**{k: v for k, v in svc["environment"].items()})
    assert not settings.embedded_store
    assert embedded_store_refusal(argv[argv.index("--pool") + 1], int(argv[argv.index("--concurrency") + 1]), settings) is None


def test_every_environment_variable_is_one_the_settings_read(compose):
    known = _settings_env_names()
    for name, svc in compose["services"].items():
        env = svc.get("environment") or {}
        keys = env.keys() if isinstance(env, dict) else [e.split("=", 1)[0] for e in env]
        if name in ("qdrant", "redis"):
            continue
        unknown = sorted(set(keys) - known)
        assert not unknown, f"{name}: {unknown} are not read by moonmind_worker.settings"
        assert keys, f"{name} has no environment wiring"


def test_services_reach_each_other_by_compose_names(compose):
    env = compose["services"]["worker"]["environment"]
    assert env["QDRANT_URL"].startswith("http://qdrant:")
    assert env["CELERY_BROKER_URL"].startswith("redis://redis:")
    for name in ("worker", "beat", "gateway"):
        deps = compose["services"][name]["depends_on"]
        assert all(d["condition"] == "service_healthy" for d in deps.values())


# ------------------------------------------------- issue 19: a stack that starts ---

ROOT = COMPOSE.parent.parent


def test_every_service_has_an_image_and_the_moonmind_ones_build_from_the_repository(compose):
    for name, svc in compose["services"].items():
        assert svc.get("image"), f"{name} has no image"
        if name in ("worker", "beat", "gateway"):
            assert svc["build"]["dockerfile"] == "compose/Dockerfile" and (COMPOSE.parent / svc["build"]["context"]).resolve() == ROOT


def test_only_the_gateway_publishes_a_port_redis_and_qdrant_stay_internal(compose):
    published = {name: svc["ports"] for name, svc in compose["services"].items() if svc.get("ports")}
    assert published == {"gateway": ["8080:8080"]}


def test_every_service_restarts_unless_stopped(compose):
    for name, svc in compose["services"].items():
        assert svc.get("restart") == "unless-stopped", name


def test_every_named_volume_is_declared_and_the_workspace_mount_exists_read_only(compose):
    declared = set(compose.get("volumes") or {})
    for name, svc in compose["services"].items():
        for spec in svc.get("volumes", []):
            source = spec.split(":", 1)[0]
            if source.startswith(("./", "${")):
                continue
            assert source in declared, f"{name}: volume {source} is not declared"
    workspace = [v for v in compose["services"]["worker"]["volumes"] if ":/workspace" in v]
    assert workspace == ["${MOONMIND_WORKSPACE:-./workspace}:/workspace:ro"]
    assert (COMPOSE.parent / "workspace").is_dir()  # the default is in the repository, so `up` needs nothing else


def test_the_gateway_token_file_lives_in_its_volume_and_the_documented_one_liner_creates_it(compose):
    from moonmind_worker.cli.main import build_parser

    gw = compose["services"]["gateway"]
    tokens = Path(gw["environment"]["MOONMIND_GATEWAY_TOKENS_FILE"])
    assert any(v.split(":")[1] == str(tokens.parent) for v in gw["volumes"])
    lines = [line for line in COMPOSE.read_text().splitlines() if "add-token" in line and "docker compose" in line]
    readme = "\n".join(p.read_text() for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
    assert lines and lines[0].lstrip("# ").strip() in readme
    argv = shlex.split(lines[0].lstrip("# "))
    run = argv[argv.index("run"):]
    assert run[:4] == ["run", "--rm", "--no-deps", "gateway"]  # the gateway's own environment and volume
    args = build_parser(run[5:]).parse_args(run[5:])
    assert args._handler.__name__ == "cmd_add_token"


@pytest.mark.slow
def test_the_gateway_healthcheck_goes_green_on_a_fresh_gateway_with_nothing_indexed(compose, home, tmp_path):
    """Run the compose healthcheck itself against a real gateway on an empty store (no collection yet)."""
    import subprocess

    from gateway_helpers import add_token, clean_env, start_gateway

    env = clean_env(home)
    add_token(env, "w", ["myrepo"], ["default"])
    gw = start_gateway(home, env, tmp_path)
    try:
        test = compose["services"]["gateway"]["healthcheck"]["test"]
        assert test[0] == "CMD"
        argv = [a.replace("http://127.0.0.1:8080", gw.url) for a in test[1:]]
        assert subprocess.run(argv, capture_output=True, timeout=30).returncode == 0
    finally:
        gw.stop()


def test_the_dockerignore_keeps_the_venv_and_git_out_but_not_what_the_dockerfile_copies():
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {".git", ".venv", "compose/workspace"} <= ignored
    copied = []
    for line in (COMPOSE.parent / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY "):
            copied += line.split()[1:-1]
    assert copied and not set(copied) & ignored
