"""The PostgreSQL engine: ``PostgresDialect`` and what it is made of.

``dialect.py`` the dialect (prepared statements, single-statement moves),
``watch.py`` its ``LISTEN`` watcher, ``partitions.py`` the dead letters' day
partitions (made ahead, dropped whole past retention).
"""

from __future__ import annotations

from .dialect import PostgresDialect

__all__ = ["PostgresDialect"]
