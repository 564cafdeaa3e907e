"""System checks on the site around the settings: handler conflicts, psycopg 3, USE_TZ."""

from __future__ import annotations

import sys

from alkstore_django import checks
from alkstore_django.handlers import HandlerRegistry
from tests.helpers import check_ids, postgres_only, sqlite_only


def send(job):
    return None


def send_again(job):
    return None


def test_check_handlers__names_every_handler_of_a_conflicting_queue(monkeypatch):
    registry = HandlerRegistry()
    registry.register("emails", send)
    registry.register("emails", send_again)
    registry.register("reports", send)
    monkeypatch.setattr(checks, "registry", registry)
    (error,) = checks.check_handlers()
    assert error.id == "alkstore.E201"
    assert error.msg == registry.conflicts()["emails"]
    assert f"{__name__}.send, {__name__}.send_again" in error.msg
    assert "TASKS" in error.hint


def test_check_handlers__the_test_project_has_no_conflict():
    assert checks.check_handlers() == []


def test_use_tz_false__is_a_check_error_saying_why(settings):
    settings.USE_TZ = False
    (error,) = [m for m in checks.check_environment() if m.id == "alkstore.E203"]
    assert error.msg == "alkstore_django needs USE_TZ = True."
    assert "enqueue(run_at=...), schedules and runscheduler fail" in error.hint


def test_use_tz_true__passes():
    assert "alkstore.E203" not in check_ids(checks.check_environment())


@postgres_only("the check is about PostgreSQL's driver; the SQLite sibling pins its silence")
def test_postgresql_without_psycopg_3__is_a_check_error_naming_the_extra(monkeypatch):
    # None in sys.modules makes "import psycopg" raise ImportError, as on a site without it.
    monkeypatch.setitem(sys.modules, "psycopg", None)
    (error,) = [m for m in checks.check_settings() if m.id == "alkstore.E202"]
    assert "'default' is PostgreSQL, and psycopg 3 cannot be imported" in error.msg
    assert "pip install 'alkstore-django[postgres]'" in error.hint


@postgres_only("with psycopg 3 importable the PostgreSQL site passes")
def test_postgresql_with_psycopg_3__passes():
    assert "alkstore.E202" not in check_ids(checks.check_settings())


@sqlite_only("a SQLite site never needs psycopg; the PostgreSQL sibling is the error")
def test_sqlite_without_psycopg__passes(monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg", None)
    assert "alkstore.E202" not in check_ids(checks.check_settings())


def test_an_engine_django_cannot_load__is_its_own_check_error(monkeypatch):
    from django.core.exceptions import ImproperlyConfigured

    class NoDriver:
        def __getitem__(self, alias):
            # What Django raises when the engine's driver is not installed at all.
            raise ImproperlyConfigured("Error loading psycopg2 or psycopg module")

    monkeypatch.setattr(checks, "connections", NoDriver())
    found = [m for m in checks.check_settings() if m.id == "alkstore.E204"]
    (error,) = [m for m in found if m.msg.startswith("ALKSTORE['DATABASE']")]
    assert "'default' cannot be used: Error loading psycopg2 or psycopg module" in error.msg
    assert "pip install 'alkstore-django[postgres]'" in error.hint
    assert "alkstore.E202" not in check_ids(checks.check_settings())
