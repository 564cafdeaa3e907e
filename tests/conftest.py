"""Shared fixtures: the engine under test, state helpers, subprocess environments."""

from __future__ import annotations

import os
import sys
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
