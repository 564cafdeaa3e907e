"""Migration 0017 on PostgreSQL: the dead letters partitioned by day, rows kept, reversible."""

from __future__ import annotations

import json

import pytest
from django.db import connection

from alkstore_django.models import DeadJob
from tests.helpers import needs, run_python

partitioned = needs(
    "supports_dead_letter_partitions",
    "no declarative partitioning here: the dead letters stay one table",
)
TABLE = DeadJob._meta.db_table
# What the catalogs say of the table: partitioned or not, its partitions and
# their rows, its primary key, its indexes and each table's storage parameters.
DESCRIBE = f"""
def describe(cursor):
    cursor.execute("SELECT relkind, reloptions FROM pg_class WHERE oid = '{TABLE}'::regclass")
    kind, options = cursor.fetchone()
    cursor.execute(
        "SELECT c.relname, c.reloptions FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = '{TABLE}'::regclass ORDER BY 1"
    )
    parts = {{}}
    for name, part_options in cursor.fetchall():
        cursor.execute(f"SELECT count(*) FROM {{name}}")
        parts[name] = [cursor.fetchone()[0], part_options]
    cursor.execute(
        "SELECT a.attname FROM pg_constraint k JOIN pg_attribute a ON a.attrelid = k.conrelid "
        "AND a.attnum = ANY(k.conkey) WHERE k.conrelid = '{TABLE}'::regclass AND k.contype = 'p' "
        "ORDER BY array_position(k.conkey, a.attnum)"
    )
    key = [row[0] for row in cursor.fetchall()]
    cursor.execute("SELECT indexname FROM pg_indexes WHERE tablename = '{TABLE}' ORDER BY 1")
    indexes = [row[0] for row in cursor.fetchall()]
    cursor.execute("SELECT count(*) FROM {TABLE}")
    rows = cursor.fetchone()[0]
    cursor.execute("SELECT EXISTS (SELECT 1 FROM pg_partitioned_table "
                   "WHERE partrelid = '{TABLE}'::regclass)")
    return dict(kind=kind, options=options, parts=parts, key=key, indexes=indexes, rows=rows,
                partitioned=cursor.fetchone()[0])
"""
ROUND_TRIP = (
    """
import json
from datetime import UTC, datetime, timedelta
import django
django.setup()
from django.core.management import call_command
from django.db import connection
from tests.factories import DeadJobFactory
"""
    + DESCRIBE
    + f"""
call_command("migrate", "alkstore_django", "0015", verbosity=0)
with connection.cursor() as cursor:
    cursor.execute("ALTER TABLE {TABLE} SET (autovacuum_vacuum_scale_factor = 0.02)")
old = datetime(2026, 3, 1, 12, tzinfo=UTC)
for died_at in (old, old + timedelta(hours=1), old - timedelta(days=30)):
    DeadJobFactory(died_at=died_at)
call_command("migrate", "alkstore_django", "0017", verbosity=0)
with connection.cursor() as cursor:
    forward = describe(cursor)
    cursor.execute("SELECT statement_timestamp()")
    today = cursor.fetchone()[0].astimezone(UTC).date()
DeadJobFactory(died_at=datetime.now(UTC))
call_command("migrate", "alkstore_django", "0015", verbosity=0)
with connection.cursor() as cursor:
    back = describe(cursor)
call_command("migrate", "alkstore_django", verbosity=0)
with connection.cursor() as cursor:
    again = describe(cursor)
print(json.dumps(dict(forward=forward, back=back, again=again, today=today.isoformat())))
"""
)


@partitioned
def test_migration__partitions_a_table_with_rows_by_day_and_reverses(
    python, subprocess_env, empty_database_url
):
    done = run_python(python, {**subprocess_env, "DATABASE_URL": empty_database_url}, ROUND_TRIP)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    forward, back, again = seen["forward"], seen["back"], seen["again"]
    options = ["autovacuum_vacuum_scale_factor=0.02"]

    assert (forward["partitioned"], forward["kind"], forward["rows"]) == (True, "p", 3)
    assert forward["key"] == ["id", "died_at"]
    assert {"alk_dead_died", "alk_dead_queue_died", f"{TABLE}_pkey"} <= set(forward["indexes"])
    parts = forward["parts"]
    assert parts[f"{TABLE}_p20260301"][0] == 2
    assert parts[f"{TABLE}_p20260130"][0] == 1
    assert parts[f"{TABLE}_default"][0] == 0
    today = seen["today"].replace("-", "")
    assert f"{TABLE}_p{today}" in parts
    # The storage parameters a partitioned table cannot hold live on every partition.
    assert all(part_options == options for _, part_options in parts.values())

    assert (back["partitioned"], back["kind"], back["rows"]) == (False, "r", 4)
    assert back["key"] == ["id"]
    assert back["parts"] == {}
    assert back["options"] == options
    assert {"alk_dead_died", "alk_dead_queue_died"} <= set(back["indexes"])

    assert (again["partitioned"], again["rows"]) == (True, 4)


@partitioned
@pytest.mark.django_db
def test_test_database__has_the_dead_letters_partitioned_with_the_models_indexes():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT partstrat FROM pg_partitioned_table WHERE partrelid = %s::regclass", [TABLE]
        )
        assert cursor.fetchone() == ("r",)
        cursor.execute("SELECT count(*) FROM pg_inherits WHERE inhparent = %s::regclass", [TABLE])
        assert cursor.fetchone()[0] >= 5  # DEFAULT, today and the three days ahead
        cursor.execute("SELECT indexname FROM pg_indexes WHERE tablename = %s ORDER BY 1", [TABLE])
        names = {row[0] for row in cursor.fetchall()}
    assert {index.name for index in DeadJob._meta.indexes} <= names
