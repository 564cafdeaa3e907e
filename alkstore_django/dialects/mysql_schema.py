"""MariaDB/MySQL: the settings, schema and server version alkstore needs.

Kept apart from ``mysql.py`` so the statements stay readable on their own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.core import checks

from .base import JOB_TABLE

MARIADB_MINIMUM = (10, 6)
MYSQL_MINIMUM = (8, 0, 1)
# Exact comparisons, as on PostgreSQL and SQLite: binary, and NO PAD so that
# 'a' and 'a ' are two names.
MARIADB_COLLATION = "utf8mb4_nopad_bin"
MYSQL_COLLATION = "utf8mb4_0900_bin"
CLAIM_INDEX = "alk_job_claim"


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
    """Give the app's tables an exact collation and the claim index led by state."""
    connection = schema_editor.connection
    collation = MARIADB_COLLATION if connection.mysql_is_mariadb else MYSQL_COLLATION
    for table in tables:
        schema_editor.execute(
            f"ALTER TABLE {table} CONVERT TO CHARACTER SET utf8mb4 COLLATE {collation}"
        )
    if JOB_TABLE not in tables:
        return
    # Django creates alk_job_claim without its WHERE state = 'pending' here:
    # leading with state keeps a claim off the queue's processing rows.
    schema_editor.execute(
        f"ALTER TABLE {JOB_TABLE} DROP INDEX {CLAIM_INDEX}, ADD INDEX {CLAIM_INDEX} "
        "(queue, state, priority DESC, run_at, id)"
    )


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
