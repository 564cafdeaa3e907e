"""Shared fixtures and hooks: subprocess environments, settings variants, an empty database.

Helpers (the engine under test, skip markers, state helpers) live in tests/helpers.py.
"""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Callable, Iterator

import pytest
from django.db import connection, connections

from tests.helpers import POOLED, ROOT, VENDOR, database_url


def pytest_addoption(parser: pytest.Parser) -> None:
    # Here, not in tests/chaos/conftest.py: pytest only asks the conftests it
    # loads at start-up, and a plain `pytest` run loads only this one then.
    parser.addoption(
        "--chaos-long",
        action="store_true",
        default=False,
        help="Run the chaos scenarios (tests/chaos) as long soaks; see docs/reliability.md.",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Give every database test the alias alkstore's tables are on, when it is not ``default``.

    The queue-database run (``ALKSTORE_TEST_QUEUE_DATABASE=1``) keeps the site's
    models on ``default`` and alkstore's on ``queues``: a test that reaches both
    needs both, as a site's test would (``databases = {"default", "queues"}``).
    """
    from django.conf import settings

    alias = settings.ALKSTORE.get("DATABASE", "default")
    if alias == "default":
        return
    for item in items:
        mark = item.get_closest_marker("django_db")
        if mark is None:
            continue
        databases = mark.kwargs.get("databases") or ["default"]
        if databases == "__all__" or alias in databases:
            continue
        kwargs = {**mark.kwargs, "databases": [*databases, alias]}
        item.add_marker(pytest.mark.django_db(*mark.args, **kwargs), append=False)


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """Behind a pooler, close its server connections before the test database is dropped.

    PgBouncer keeps idle server connections to the test database, and
    PostgreSQL refuses to drop a database that has sessions.
    """
    yield
    if not POOLED:
        return
    with django_db_blocker.unblock(), connections["direct"].cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    connections["direct"].close()


@pytest.fixture
def subprocess_env() -> dict[str, str]:
    """Environment for a child ``manage.py``/python process on the test database."""
    env = dict(os.environ)
    env["DATABASE_URL"] = database_url()
    if POOLED:
        # Past the pooler, to the same test database (the alias mirrors default).
        env["DIRECT_DATABASE_URL"] = database_url("direct").replace(
            connections["direct"].settings_dict["NAME"], connection.settings_dict["NAME"]
        )
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    # A child has no "shard" alias unless its settings add it (tests/settings.py).
    env["ALKSTORE_TEST_CHILD"] = "1"
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
def empty_database_url(tmp_path, django_db_blocker) -> Iterator[str]:
    """Yield a DATABASE_URL of a database without any table, on the engine under test."""
    if VENDOR == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.sqlite3'}"
        return
    name = f"{connection.settings_dict['NAME']}_empty"
    quoted = connection.ops.quote_name(name)
    # PgBouncer keeps its server connection to the database after the
    # subprocess under test has gone, so a plain DROP would find it "being
    # accessed by other users"; FORCE (PostgreSQL 13+) ends such sessions.
    drop = f"DROP DATABASE IF EXISTS {quoted}"
    if VENDOR == "postgresql":
        drop += " WITH (FORCE)"
    # The server-level cursor Django itself creates test databases with.
    with django_db_blocker.unblock(), connection._nodb_cursor() as cursor:
        cursor.execute(drop)
        cursor.execute(f"CREATE DATABASE {quoted}")
    try:
        yield database_url().rsplit("/", 1)[0] + f"/{name}"
    finally:
        with django_db_blocker.unblock(), connection._nodb_cursor() as cursor:
            cursor.execute(drop)
