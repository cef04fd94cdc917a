"""docker-compose.yml (Docker does not run here): structure, order of start, health check, gunicorn."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def load():
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_services_and_order():
    doc = load()
    services = doc["services"]
    assert set(services) == {"db", "migrate", "server"}
    assert services["db"]["image"].startswith("postgres:")
    assert "pg_isready" in " ".join(services["db"]["healthcheck"]["test"])
    assert services["migrate"]["depends_on"]["db"]["condition"] == "service_healthy"
    assert services["migrate"]["command"][-2:] == ["upgrade", "head"]
    assert services["server"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert "pgdata" in doc["volumes"]


def test_server_runs_gunicorn_with_health_check():
    server = load()["services"]["server"]
    cmd = server["command"]
    assert cmd[0] == "gunicorn" and cmd[-1] == "kvreport_server:create_app()"
    assert "/healthz" in " ".join(server["healthcheck"]["test"])
    env = server["environment"]
    assert env["KVREPORT_DATABASE_URL"].startswith("postgresql+psycopg://")
    assert "KVREPORT_SECRET_KEY" in env


def test_image_copies_what_it_installs():
    build = load()["services"]["server"]["build"]
    inline = build["dockerfile_inline"]
    for path in ("pyproject.toml", "collector", "server", "migrations", "alembic.ini"):
        assert path in inline and (ROOT / path).exists()
    assert "USER kvreport" in inline


def test_gunicorn_can_import_the_factory(tmp_path, monkeypatch):
    """The exact app spec gunicorn is given builds an app from environment variables alone."""
    from gunicorn.util import import_app

    from kvreport_server import migrate

    url = f"sqlite:///{tmp_path / 'g.sqlite3'}"
    migrate.upgrade(url)
    monkeypatch.setenv("KVREPORT_DATABASE_URL", url)
    monkeypatch.setenv("KVREPORT_LOG_REQUESTS", "0")
    app = import_app("kvreport_server:create_app()")
    assert app.test_client().get("/healthz").status_code == 200


def test_config_from_environment():
    import pytest

    from kvreport_server.config import load_config

    cfg = load_config({"KVREPORT_PRIVATE": "1", "KVREPORT_MAX_BODY_BYTES": "1000", "KVREPORT_RATE_LIMIT_LOGIN": "",
                       "KVREPORT_ISSUE_REPO": "ggml-org/llama.cpp", "KVREPORT_PAGE_SIZE": ""})
    assert cfg["PRIVATE"] is True and cfg["MAX_BODY_BYTES"] == 1000 and cfg["RATE_LIMIT_LOGIN"] is None
    assert cfg["ISSUE_REPO"] == "ggml-org/llama.cpp" and cfg["PAGE_SIZE"] == 50
    assert load_config({})["RATE_LIMIT_LOGIN"] == "20/minute"
    with pytest.raises(ValueError, match="KVREPORT_MAX_JSON_DEPTH"):
        load_config({"KVREPORT_MAX_JSON_DEPTH": "deep"})
    with pytest.raises(ValueError, match="KVREPORT_MAX_BODY_BYTES must be at least 1"):
        load_config({"KVREPORT_MAX_BODY_BYTES": "-1"})
    assert load_config({"KVREPORT_TRUST_PROXY": "0"})["TRUST_PROXY"] == 0
    with pytest.raises(ValueError, match="KVREPORT_RATE_LIMIT_UPLOAD must be a rate"):
        load_config({"KVREPORT_RATE_LIMIT_UPLOAD": "lots"})
    with pytest.raises(ValueError, match="KVREPORT_SECRETS_POLICY must be refuse or flag"):
        load_config({"KVREPORT_SECRETS_POLICY": "ignore"})
    assert load_config({"KVREPORT_RATE_LIMIT_UPLOAD": "120/minute;10/second"})["RATE_LIMIT_UPLOAD"]


def test_build_context_leaves_out_the_virtualenv():
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored
    inline = load()["services"]["server"]["build"]["dockerfile_inline"]
    for line in inline.splitlines():
        if line.strip().startswith("COPY"):
            for src in line.split()[1:-1]:
                assert src not in ignored
