"""The PostgreSQL engine: ``PostgresDialect`` and what it is made of.

``dialect.py`` the dialect (prepared statements, single-statement moves),
``watch.py`` its ``LISTEN`` watcher, ``autovacuum.py`` the hot tables'
per-table autovacuum settings (migration 0016).
"""

from __future__ import annotations

from .dialect import PostgresDialect

__all__ = ["PostgresDialect"]
