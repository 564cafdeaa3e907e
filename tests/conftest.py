"""Shared fixtures: the engine under test, state helpers, subprocess environments."""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent
VENDOR = "postgresql" if "postgresql" in settings.DATABASES["default"]["ENGINE"] else "sqlite"


def pytest_addoption(parser: pytest.Parser) -> None:
    # Here, not in tests/chaos/conftest.py: pytest only asks the conftests it
    # loads at start-up, and a plain `pytest` run loads only this one then.
    parser.addoption(
        "--chaos-long",
        action="store_true",
        default=False,
        help="Run the chaos scenarios (tests/chaos) as long soaks; see docs/reliability.md.",
    )


def postgres_only(reason: str) -> pytest.MarkDecorator:
    """Skip on SQLite, saying what SQLite physically lacks and where the sibling is."""
    return pytest.mark.skipif(VENDOR != "postgresql", reason=f"PostgreSQL only: {reason}")


def sqlite_only(reason: str) -> pytest.MarkDecorator:
    """Skip on PostgreSQL: the test pins SQLite's own behaviour."""
    return pytest.mark.skipif(VENDOR != "sqlite", reason=f"SQLite only: {reason}")


def database_url() -> str:
    """Return a DATABASE_URL for the database the tests are using (the test database)."""
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    user = s.get("USER") or "postgres"
    host = s.get("HOST") or "127.0.0.1"
    port = s.get("PORT") or 5432
    return f"postgres://{user}@{host}:{port}/{s['NAME']}"


@pytest.fixture
def subprocess_env() -> dict[str, str]:
    """Environment for a child ``manage.py``/python process on the test database."""
    env = dict(os.environ)
    env["DATABASE_URL"] = database_url()
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture
def python() -> str:
    return sys.executable


@pytest.fixture
def settings_variant(tmp_path, subprocess_env) -> Callable[..., dict[str, str]]:
    """Return ``make(body, files={})``: the child environment of a settings module over ours.

    The module starts with ``from tests.settings import *`` and then ``body``;
    ``files`` (path -> text) are written next to it, e.g. an extra app.
    """

    def make(body: str, files: dict[str, str] | None = None) -> dict[str, str]:
        for relative, text in (files or {}).items():
            path = tmp_path / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(text))
        module = "from tests.settings import *  # noqa: F403\n" + textwrap.dedent(body)
        (tmp_path / "variant_settings.py").write_text(module)
        env = dict(subprocess_env)
        env["DJANGO_SETTINGS_MODULE"] = "variant_settings"
        env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
        return env

    return make


@pytest.fixture
def empty_database_url(tmp_path) -> Iterator[str]:
    """Yield a DATABASE_URL of a database without any table, on the engine under test."""
    if VENDOR == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.sqlite3'}"
        return
    import psycopg

    s = connection.settings_dict
    name = f"{s['NAME']}_empty"
    server = {"host": s.get("HOST") or "127.0.0.1", "port": s.get("PORT") or 5432}
    user = s.get("USER") or "postgres"
    with psycopg.connect(dbname="postgres", user=user, autocommit=True, **server) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgres://{user}@{server['host']}:{server['port']}/{name}"
    finally:
        with psycopg.connect(dbname="postgres", user=user, autocommit=True, **server) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
