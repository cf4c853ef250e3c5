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
    from moonmind_worker.cli import build_parser

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
    assert argv[argv.index("-Q") + 1].split(",") == [svc["environment"]["MOONMIND_SEARCH_QUEUE"], svc["environment"]["MOONMIND_INDEX_QUEUE"]]
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
