"""compose/docker-compose.yml, checked statically (no Docker engine here): it parses, has the whole
stack with health checks, every command names a real entry point, every variable is one the settings read."""

from __future__ import annotations

import re
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
                assert argv[1:3] == ["-A", "moonmind_worker.celery"] and argv[3] in ("worker", "beat"), argv
                import moonmind_worker.celery

                assert moonmind_worker.celery.app.main == "moonmind"
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

_VARIABLE = re.compile(r"\$\{(\w+)(?::([-?])([^}]*))?\}")


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's interpolation of `${VAR}`, `${VAR:-default}` and `${VAR:?error}` (unset or empty alike)."""

    def one(match: re.Match) -> str:
        name, op, arg = match.groups()
        if env.get(name):
            return env[name]
        if op == "?":
            raise ValueError(f"required variable {name} is missing a value: {arg}")
        return arg if op == "-" else ""

    return _VARIABLE.sub(one, text)


ROOT = COMPOSE.parent.parent


def test_every_service_has_an_image_and_the_moonmind_ones_build_from_the_repository(compose):
    for name, svc in compose["services"].items():
        assert svc.get("image"), f"{name} has no image"
        if name in ("worker", "beat", "gateway"):
            assert svc["build"]["dockerfile"] == "compose/Dockerfile" and (COMPOSE.parent / svc["build"]["context"]).resolve() == ROOT


def test_only_the_gateway_publishes_a_port_redis_and_qdrant_stay_internal(compose):
    published = {name: [interpolate(p, {}) for p in svc["ports"]] for name, svc in compose["services"].items() if svc.get("ports")}
    assert published == {"gateway": ["127.0.0.1:8080:8080"]}


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
    assert [interpolate(v, {"MOONMIND_WORKSPACE": "/src/app"}) for v in workspace] == ["/src/app:/workspace:ro"]


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


# ------------------------------------------------- issue 35: no surprises ---


def test_without_moonmind_workspace_compose_stops_at_start_with_the_fix(compose):
    """No empty default tree (a search that finds nothing): compose's `:?` refuses to start, saying what to set."""
    (workspace,) = [v for v in compose["services"]["worker"]["volumes"] if ":/workspace" in v]
    with pytest.raises(ValueError, match="set MOONMIND_WORKSPACE to the tree to index"):
        interpolate(workspace, {})


def test_the_gateway_port_is_published_on_loopback_unless_told_otherwise(compose):
    (port,) = compose["services"]["gateway"]["ports"]
    assert interpolate(port, {}) == "127.0.0.1:8080:8080"
    assert interpolate(port, {"MOONMIND_GATEWAY_BIND": "0.0.0.0"}) == "0.0.0.0:8080:8080"


def _constraints_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("compose_constraints", COMPOSE.parent / "constraints.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_image_installs_its_dependencies_pinned_to_the_versions_tested_here():
    dockerfile = (COMPOSE.parent / "Dockerfile").read_text()
    (install,) = [line for line in dockerfile.splitlines() if "pip install" in line]
    assert "--constraint compose/constraints.txt ." in install
    assert "COPY compose/constraints.txt ./compose/constraints.txt" in dockerfile
    committed = (COMPOSE.parent / "constraints.txt").read_text()
    pins = dict(line.split("==") for line in committed.splitlines() if line and not line.startswith("#"))
    # every direct dependency is pinned inside pyproject's range (a fresh venv may hold newer releases than the
    # pins: `.venv/bin/python compose/constraints.py` re-pins to what a run tested)
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pinned = {canonicalize_name(name): version for name, version in pins.items()}
    project = tomllib.loads((COMPOSE.parent.parent / "pyproject.toml").read_text())["project"]
    for line in project["dependencies"]:
        req = Requirement(line)
        name = canonicalize_name(req.name)
        assert name in pinned, f"{req.name} is not pinned: run .venv/bin/python compose/constraints.py"
        assert req.specifier.contains(pinned[name], prereleases=True), f"{req.name}=={pinned[name]} is outside {req}"
    assert {"celery", "kombu", "qdrant-client", "pydantic", "fastapi", "uvicorn", "mcp"} <= set(pins)
    assert {"pytest", "ruff", "mypy", "fakeredis"}.isdisjoint(pins)  # what the image installs, not the test tools


def test_constraints_help_prints_usage_and_writes_nothing(tmp_path):
    """Issue 57: `compose/constraints.py --help` rewrote compose/constraints.txt."""
    import subprocess
    import sys

    target = COMPOSE.parent / "constraints.txt"
    before = (target.read_bytes(), target.stat().st_mtime_ns)
    p = subprocess.run([sys.executable, str(COMPOSE.parent / "constraints.py"), "--help"], capture_output=True, text=True)
    assert p.returncode == 0 and "usage:" in p.stdout and "--check" in p.stdout
    assert (target.read_bytes(), target.stat().st_mtime_ns) == before


def test_the_beat_healthcheck_reads_the_schedule_file_beat_writes(compose):
    beat = compose["services"]["beat"]
    argv = _argv(beat["command"])
    schedule = argv[argv.index("--schedule") + 1]
    assert beat["healthcheck"]["test"] == ["CMD", "python", "-m", "moonmind_worker.celery.beat_health", schedule]
    assert any(v.split(":")[1] == str(Path(schedule).parent) for v in beat["volumes"])


@pytest.mark.slow
def test_the_beat_healthcheck_is_green_while_beat_sends_the_sweep_and_red_once_it_stops(compose, env, tmp_path):
    """A real `celery beat` (the sweep every second) on the test Redis: its schedule file stays on disk after it
    stops, yet the healthcheck fails once 3 intervals pass without beat sending the sweep."""
    import subprocess
    import sys
    import time

    from celery_helpers import CELERY, purge, queue_env, stop, unique_queues

    sq, iq = unique_queues()
    beat_env = {**queue_env(env, sq, iq), "MOONMIND_OVERLAY_SWEEP_INTERVAL_S": "1"}
    schedule = tmp_path / "celerybeat-schedule"
    test = compose["services"]["beat"]["healthcheck"]["test"]
    argv = [sys.executable if a == "python" else a for a in test[1:-1]] + [str(schedule)]

    def healthcheck() -> subprocess.CompletedProcess:
        return subprocess.run(argv, env=beat_env, cwd=tmp_path, capture_output=True, text=True, timeout=60)

    log = tmp_path / "beat.log"
    beat = subprocess.Popen([CELERY, "-A", "moonmind_worker.celery", "beat", "-l", "INFO", "--schedule", str(schedule)], cwd=ROOT,
                            env=beat_env, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while log.read_text().count("Sending due task") < 2 or healthcheck().returncode != 0:
            assert beat.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
    finally:
        stop(beat)
        purge(sq, iq)
    deadline = time.monotonic() + 60
    while (stale := healthcheck()).returncode == 0:  # until over 3 x the interval has passed since beat last sent the sweep
        assert time.monotonic() < deadline, "the healthcheck never saw the stopped beat as stale"
        time.sleep(0.2)
    assert any(schedule.parent.glob("celerybeat-schedule*"))  # the file is still there
    assert stale.returncode == 1 and "last scheduled the overlay sweep" in stale.stderr, stale
