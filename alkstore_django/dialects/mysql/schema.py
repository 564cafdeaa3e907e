"""MariaDB/MySQL: the settings, schema and server version alkstore needs.

Kept apart from ``dialect.py`` so the statements stay readable on their own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.core import checks

from ..base import JOB_TABLE

MARIADB_MINIMUM = (10, 6)
MYSQL_MINIMUM = (8, 0, 1)
# Exact comparisons, as on PostgreSQL and SQLite: binary, and NO PAD so that
# 'a' and 'a ' are two names.
MARIADB_COLLATION = "utf8mb4_nopad_bin"
MYSQL_COLLATION = "utf8mb4_0900_bin"
CLAIM_INDEX = "alk_job_claim"
UNIQUE_INDEX = "alk_job_unique"
KEY_INDEX = "alk_job_key"


def settings_warnings(alias: str, config: dict[str, Any]) -> list[checks.CheckMessage]:
    """Warn about a connection charset that cannot hold every name, or gap-locking isolation.

    Under ``REPEATABLE READ`` a claim's locking read also locks the gaps it
    scans, so enqueues wait behind claims and deadlock with them.
    """
    options = config.get("OPTIONS", {})
    warnings: list[checks.CheckMessage] = []
    charset = str(options.get("charset", "utf8mb4")).lower()
    if charset != "utf8mb4":
        warnings.append(
            checks.Warning(
                f"DATABASES[{alias!r}] connects with charset {charset!r}.",
                hint='Use "OPTIONS": {"charset": "utf8mb4"}: names and payloads are full Unicode.',
                obj="settings.DATABASES",
                id="alkstore.W002",
            )
        )
    isolation = str(options.get("isolation_level", "read committed")).lower()
    if isolation != "read committed":
        warnings.append(
            checks.Warning(
                f"DATABASES[{alias!r}] uses isolation level {isolation!r}.",
                hint="Use Django's default, 'read committed': other levels make claims "
                "lock gaps that enqueues then wait for.",
                obj="settings.DATABASES",
                id="alkstore.W003",
            )
        )
    return warnings


def prepare_schema(schema_editor: Any, tables: Sequence[str]) -> None:
    """Give the app's tables an exact collation, the claim index led by state, the unique index.

    Idempotent, and cheap when already done (each step first asks the
    catalogue), so every migration that adds a table or one of these
    indexes calls it again.
    """
    connection = schema_editor.connection
    collation = MARIADB_COLLATION if connection.mysql_is_mariadb else MYSQL_COLLATION
    with connection.cursor() as cursor:
        for table in tables:
            cursor.execute(
                "SELECT table_collation FROM information_schema.tables "
                "WHERE table_schema = DATABASE() AND table_name = %s",
                [table],
            )
            row = cursor.fetchone()
            if row is None or row[0] != collation:
                schema_editor.execute(
                    f"ALTER TABLE {table} CONVERT TO CHARACTER SET utf8mb4 COLLATE {collation}"
                )
        led_by_state = _index_column(cursor, CLAIM_INDEX, 2) == "state"
        has_unique = _index_column(cursor, UNIQUE_INDEX, 1) is not None
        # Before migration 0011 (when 0007 calls this) there is no key to index.
        cursor.execute(
            "SELECT 1 FROM information_schema.columns WHERE table_schema = DATABASE() "
            "AND table_name = %s AND column_name = 'unique_key'",
            [JOB_TABLE],
        )
        has_key = cursor.fetchone() is not None
        cursor.execute(
            "SELECT 1 FROM information_schema.columns WHERE table_schema = DATABASE() "
            "AND table_name = %s AND column_name = 'concurrency_key'",
            [JOB_TABLE],
        )
        has_concurrency_key = cursor.fetchone() is not None
        has_key_index = _index_column(cursor, KEY_INDEX, 1) is not None
    # Django creates alk_job_claim without its WHERE state = 'pending' here:
    # leading with state keeps a claim off the queue's processing rows.
    if not led_by_state:
        schema_editor.execute(
            f"ALTER TABLE {JOB_TABLE} DROP INDEX {CLAIM_INDEX}, ADD INDEX {CLAIM_INDEX} "
            "(queue, state, priority DESC, run_at, id)"
        )
    # Django skips alk_job_unique here (it is partial). Unconditioned it means
    # the same: every row of the table is live, and NULL keys never clash.
    if has_key and not has_unique:
        schema_editor.execute(
            f"ALTER TABLE {JOB_TABLE} ADD UNIQUE INDEX {UNIQUE_INDEX} (queue, unique_key)"
        )
    # Django skips alk_job_key here (it is partial). Without state it is not
    # touched by a claim's update; only inserts and deletes maintain it.
    if has_concurrency_key and not has_key_index:
        schema_editor.execute(
            f"ALTER TABLE {JOB_TABLE} ADD INDEX {KEY_INDEX} "
            "(queue, concurrency_key, priority DESC, run_at, id)"
        )


def drop_unique_index(schema_editor: Any) -> None:
    """Drop ``alk_job_unique`` before migration 0011 is reversed.

    Dropping ``unique_key`` alone would leave the index as a unique index on
    ``queue``: one live job per queue.
    """
    with schema_editor.connection.cursor() as cursor:
        present = _index_column(cursor, UNIQUE_INDEX, 1) is not None
    if present:
        schema_editor.execute(f"ALTER TABLE {JOB_TABLE} DROP INDEX {UNIQUE_INDEX}")


def _index_column(cursor: Any, index: str, position: int) -> str | None:
    """Return the column at ``position`` (from 1) of the job table's ``index``, or None."""
    cursor.execute(
        "SELECT column_name FROM information_schema.statistics WHERE table_schema = DATABASE() "
        "AND table_name = %s AND index_name = %s AND seq_in_index = %s",
        [JOB_TABLE, index, position],
    )
    row = cursor.fetchone()
    return None if row is None else str(row[0])


def server_problem(connection: Any) -> str | None:
    """Return why this server cannot run alkstore (no ``SKIP LOCKED``), or None."""
    connection.ensure_connection()
    version = tuple(connection.mysql_version)
    mariadb = connection.mysql_is_mariadb
    minimum = MARIADB_MINIMUM if mariadb else MYSQL_MINIMUM
    if version >= minimum:
        return None
    name = "MariaDB" if mariadb else "MySQL"
    return (
        f"{name} {'.'.join(map(str, version))} lacks FOR UPDATE SKIP LOCKED: alkstore_django "
        f"needs {name} {'.'.join(map(str, minimum))} or later."
    )
