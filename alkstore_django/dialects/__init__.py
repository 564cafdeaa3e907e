"""Vendor SQL: the only module tree that writes raw SQL or switches on ``connection.vendor``."""

from __future__ import annotations

from django.db import connections

from ..errors import InvalidArgument
from .base import Dialect


def dialect_for(using: str) -> Dialect:
    """Return the dialect for the database alias ``using``."""
    vendor = connections[using].vendor
    if vendor == "postgresql":
        from .postgresql import PostgresDialect

        return PostgresDialect(using)
    if vendor == "sqlite":
        from .sqlite import SqliteDialect

        return SqliteDialect(using)
    raise InvalidArgument(
        f"Unsupported database vendor {vendor!r} for alias {using!r}: "
        "expected postgresql or sqlite."
    )


__all__ = ["Dialect", "dialect_for"]
