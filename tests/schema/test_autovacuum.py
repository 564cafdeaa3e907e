"""Migration 0016: the hot tables' autovacuum parameters on PostgreSQL, nothing elsewhere."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from alkstore_django.dialects import dialect_class
from tests.helpers import VENDOR, postgres_only

pytestmark = pytest.mark.django_db(transaction=True)


def reloptions(table: str) -> dict[str, float]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE relname = %s", [table])
        (options,) = cursor.fetchone()
    return {k: float(v) for k, v in (item.split("=", 1) for item in options or [])}


@postgres_only("per-table storage parameters (pg_class.reloptions) are PostgreSQL's")
def test_migrate__sets_the_autovacuum_parameters_of_every_hot_table():
    from alkstore_django.dialects.postgresql.autovacuum import AUTOVACUUM

    assert "alkstore_django_job" in AUTOVACUUM
    for table, params in AUTOVACUUM.items():
        assert reloptions(table) == {k: float(v) for k, v in params.items()}, table


@postgres_only("per-table storage parameters (pg_class.reloptions) are PostgreSQL's")
def test_reversing_the_migration__resets_them_and_keeps_a_sites_own_parameter():
    from alkstore_django.dialects.postgresql.autovacuum import AUTOVACUUM

    cls = dialect_class(VENDOR)
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE alkstore_django_job SET (fillfactor = 90)")
    try:
        with connection.schema_editor() as editor:
            cls.untune_storage(editor)
        assert all(
            reloptions(table) == {} for table in AUTOVACUUM if table != "alkstore_django_job"
        )
        assert reloptions("alkstore_django_job") == {"fillfactor": 90.0}
    finally:
        with connection.schema_editor() as editor:
            cls.tune_storage(editor)
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE alkstore_django_job RESET (fillfactor)")
    assert reloptions("alkstore_django_job")["autovacuum_vacuum_threshold"] == 5_000


@pytest.mark.skipif(VENDOR == "postgresql", reason="the PostgreSQL siblings are above")
def test_the_autovacuum_step__does_nothing_on_an_engine_without_it():
    """SQLite has no autovacuum daemon; MariaDB's InnoDB purges by itself."""
    cls = dialect_class(VENDOR)
    with CaptureQueriesContext(connection) as captured, connection.schema_editor() as editor:
        cls.tune_storage(editor)
        cls.untune_storage(editor)
    assert [q for q in captured.captured_queries if "ALTER" in q["sql"].upper()] == []
