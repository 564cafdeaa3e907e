"""The PostgreSQL engine: ``PostgresDialect`` and what it is made of.

``dialect.py`` the dialect (prepared statements, single-statement moves),
``watch.py`` its ``LISTEN`` watcher, ``autovacuum.py`` the hot tables'
per-table autovacuum settings (migration 0016), ``partitions.py`` the dead
letters' day partitions (made ahead, dropped whole past retention; 0017).
"""

from __future__ import annotations

from .dialect import PostgresDialect

__all__ = ["PostgresDialect"]
