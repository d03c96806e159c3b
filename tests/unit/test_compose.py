"""docker-compose.yml validates with docker-compose and wires the stack as documented."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yml"
PASSWORD = "Compose-Test-Passw0rd!"


def _compose_config(tmp_path: Path, password: str | None) -> subprocess.CompletedProcess[str]:
    """`docker-compose config -q` on the repository's file, isolated from any .env and OPENSEARCH_* in the shell."""
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.fail("docker-compose is not installed; install it with: apt-get install -y docker-compose")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENSEARCH_", "COMPOSE_"))}
    if password is not None:
        env["OPENSEARCH_ADMIN_PASSWORD"] = password
    empty = tmp_path / "empty.env"
    empty.write_text("")
    return subprocess.run([exe, "--env-file", str(empty), "-f", str(COMPOSE), "config", "-q"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def _services() -> dict[str, dict[str, Any]]:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {k: str(v) for k, v in env.items()}


def _command(service: dict[str, Any]) -> list[str]:
    cmd = service["command"]
    return shlex.split(cmd) if isinstance(cmd, str) else [str(c) for c in cmd]


def _from_env(value: str, var: str) -> bool:
    return re.fullmatch(r"\$\{" + var + r"(:?\?[^}]*)?\}", value) is not None


def test_compose_config_validates(tmp_path: Path) -> None:
    proc = _compose_config(tmp_path, PASSWORD)
    assert proc.returncode == 0, proc.stderr


def test_compose_config_requires_admin_password(tmp_path: Path) -> None:
    proc = _compose_config(tmp_path, None)
    assert proc.returncode != 0
    assert "OPENSEARCH_ADMIN_PASSWORD" in proc.stdout + proc.stderr


def test_healthy_dependencies_have_healthchecks() -> None:
    services = _services()
    waited_on = {name for svc in services.values() for name, dep in (svc.get("depends_on") or {}).items()
                 if isinstance(dep, dict) and dep.get("condition") == "service_healthy"}
    assert {"opensearch", "redis"} <= waited_on
    for name in waited_on:
        check = services[name].get("healthcheck") or {}
        assert check.get("test") and not check.get("disable"), f"{name} is waited on but has no healthcheck"


def test_opensearch_keeps_security_on() -> None:
    services = _services()
    node, dashboards = _env(services["opensearch"]), _env(services["dashboards"])
    assert "DISABLE_SECURITY_PLUGIN" not in node
    assert "plugins.security.disabled" not in node
    assert _from_env(node["OPENSEARCH_INITIAL_ADMIN_PASSWORD"], "OPENSEARCH_ADMIN_PASSWORD")
    assert "DISABLE_SECURITY_DASHBOARDS_PLUGIN" not in dashboards
    assert "https://opensearch:9200" in dashboards["OPENSEARCH_HOSTS"]
    assert _from_env(dashboards["OPENSEARCH_PASSWORD"], "OPENSEARCH_ADMIN_PASSWORD")
    health = " ".join(services["opensearch"]["healthcheck"]["test"])
    assert "https://" in health and "-u" in health and "wait_for_status=yellow" in health


def test_snapshots_volume_mounted_at_path_repo() -> None:
    node = _services()["opensearch"]
    repo = _env(node)["path.repo"]
    mounts = dict(v.split(":")[:2][::-1] for v in node["volumes"])
    assert mounts.get(repo) == "os-snapshots"
    assert {"os-data", "os-snapshots", "redis-data"} <= set(yaml.safe_load(COMPOSE.read_text())["volumes"])


def test_worker_and_init_run_existing_entry_points() -> None:
    from hybridsearch.config import Settings
    from workers import celery_app

    services = _services()
    worker = _command(services["worker"])
    assert worker[:2] == ["hybridsearch", "worker"]  # checks the broker, then runs workers.celery_app
    from hybridsearch.cli import build_parser

    assert build_parser().parse_args(worker[1:]).func.__name__ == "cmd_worker"
    assert celery_app.app.main == "hybridsearch"
    assert _command(services["init"]) == ["hybridsearch", "templates", "apply"]
    assert services["init"].get("restart") == "no"
    for name in ("worker", "init"):
        env = _env(services[name])
        assert _from_env(env["HYBRIDSEARCH_OPENSEARCH_PASSWORD"], "OPENSEARCH_ADMIN_PASSWORD")
        for key in env:
            assert key.startswith("HYBRIDSEARCH_"), key
            assert key.removeprefix("HYBRIDSEARCH_").lower() in Settings.model_fields, f"{name}: no setting {key}"


def test_env_example_matches_compose_defaults() -> None:
    example = dict(line.split("=", 1) for line in (REPO / ".env.example").read_text().splitlines()
                   if line and not line.startswith("#"))
    assert example["OPENSEARCH_ADMIN_PASSWORD"] == ""
    image = _services()["opensearch"]["image"]
    assert image == f"opensearchproject/opensearch:${{OPENSEARCH_VERSION:-{example['OPENSEARCH_VERSION']}}}"
    # the release CI tests, and the local node's default
    from hybridsearch.config import Settings

    assert example["OPENSEARCH_VERSION"] == Settings.model_fields["opensearch_version"].default
