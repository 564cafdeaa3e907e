"""Vendor SQL: the only module tree that writes raw SQL or switches on ``connection.vendor``.

``DIALECTS`` maps each supported Django vendor to its engine's folder; every
other question about an engine is a capability flag on ``Dialect``. An engine
module is imported only when a database of its vendor is used, so a site on
SQLite needs neither psycopg nor mysqlclient.
"""

from __future__ import annotations

import threading
from importlib import import_module
from typing import TYPE_CHECKING, Any, TypeAlias, cast

from django.db import connections

from ..errors import InvalidArgument
from .base import Dialect, Watcher

if TYPE_CHECKING:
    from .mysql import MysqlDialect
    from .postgresql import PostgresDialect
    from .sqlite import SqliteDialect

    #: What a service holds: one engine's dialect, the ``Dialect`` interface plus
    #: the shared statement groups its class line lists. A union, so mypy checks
    #: every call against every engine.
    AnyDialect: TypeAlias = MysqlDialect | PostgresDialect | SqliteDialect

# vendor -> "module:class"; MariaDB and MySQL share Django's "mysql" vendor.
DIALECTS = {
    "postgresql": "postgresql:PostgresDialect",
    "sqlite": "sqlite:SqliteDialect",
    "mysql": "mysql:MysqlDialect",
}
SUPPORTED = "PostgreSQL 13+, SQLite 3.35+, MariaDB 10.6+ and MySQL 8.0+"

_dialects: dict[str, AnyDialect] = {}
_dialects_lock = threading.Lock()


def dialect_class(vendor: str) -> type[Dialect] | None:
    """Return the dialect class for a Django vendor name, or None when it is not supported."""
    path = DIALECTS.get(vendor)
    if path is None:
        return None
    module, name = path.split(":")
    cls: type[Dialect] = getattr(import_module(f"{__name__}.{module}"), name)
    return cls


def dialect_for(using: str) -> AnyDialect:
    """Return the shared dialect of the database alias ``using``.

    One instance per alias (it keeps per-thread cursors); ``forget_dialects``
    drops them when ``DATABASES`` changes. Raises ``InvalidArgument`` naming
    the vendor for an engine alkstore does not support.
    """
    dialect = _dialects.get(using)
    if dialect is not None:
        return dialect
    vendor = connections[using].vendor
    cls = dialect_class(vendor)
    if cls is None:
        raise InvalidArgument(
            f"Unsupported database vendor {vendor!r} for alias {using!r}: "
            f"alkstore_django supports {SUPPORTED}."
        )
    with _dialects_lock:
        return _dialects.setdefault(using, cast("AnyDialect", cls(using)))


def forget_dialects() -> None:
    """Drop the shared dialects (the test settings changed ``DATABASES``)."""
    with _dialects_lock:
        _dialects.clear()


def prepare_connection(connection: Any) -> None:
    """Let the connection's engine configure it; a vendor alkstore does not use is left alone."""
    cls = dialect_class(connection.vendor)
    if cls is not None:
        cls.prepare_connection(connection)


def prepare_schema(schema_editor: Any, tables: list[str]) -> None:
    """Let the engine adjust the app's tables after they are created (a migration's step)."""
    cls = dialect_class(schema_editor.connection.vendor)
    if cls is not None:
        cls.prepare_schema(schema_editor, tables)


def prepare_app_schema(apps: Any, schema_editor: Any) -> None:
    """``RunPython`` body: ``prepare_schema`` over every table of the app at this migration."""
    models = apps.get_app_config("alkstore_django").get_models()
    prepare_schema(schema_editor, sorted(model._meta.db_table for model in models))


def unprepare_app_schema(apps: Any, schema_editor: Any) -> None:
    """``RunPython`` reverse body: let the engine drop what the forward step added."""
    cls = dialect_class(schema_editor.connection.vendor)
    if cls is not None:
        cls.unprepare_schema(schema_editor)


def tune_app_storage(apps: Any, schema_editor: Any) -> None:
    """``RunPython`` body: let the engine set its per-table storage settings (autovacuum)."""
    cls = dialect_class(schema_editor.connection.vendor)
    if cls is not None:
        cls.tune_storage(schema_editor)


def untune_app_storage(apps: Any, schema_editor: Any) -> None:
    """``RunPython`` reverse body: let the engine undo ``tune_app_storage``."""
    cls = dialect_class(schema_editor.connection.vendor)
    if cls is not None:
        cls.untune_storage(schema_editor)


__all__ = [
    "DIALECTS",
    "AnyDialect",
    "Dialect",
    "Watcher",
    "dialect_class",
    "dialect_for",
    "forget_dialects",
    "prepare_app_schema",
    "prepare_connection",
    "prepare_schema",
    "tune_app_storage",
    "unprepare_app_schema",
    "untune_app_storage",
]
