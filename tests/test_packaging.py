"""pyproject.toml ships every package, the templates, the demo bundles and the migrations."""

from __future__ import annotations

import tomllib

from tests.paths import ROOT


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_python_package_is_listed():
    st = _setuptools()
    listed = set(st["packages"])
    found = set()
    for base, name in (("collector", "kvreport"), ("server", "kvreport_server")):
        for init in (ROOT / base / name).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / base)
            found.add(".".join(rel.parts))
    assert found <= listed, f"add to [tool.setuptools] packages: {sorted(found - listed)}"


def test_migrations_install_inside_the_server_package():
    st = _setuptools()
    assert st["package-dir"]["kvreport_server.migrations"] == "migrations"
    assert {"kvreport_server.migrations", "kvreport_server.migrations.versions"} <= set(st["packages"])
    assert (ROOT / "migrations" / "env.py").is_file()


def test_migrations_are_found_from_python():
    from kvreport_server.migrate import script_location

    assert (script_location() / "versions").is_dir()
