"""The MariaDB/MySQL engine: ``MysqlDialect`` and what it is made of.

``dialect.py`` the dialect, ``watch.py`` its polling watcher, ``schema.py``
its schema and settings hooks, ``upserts.py`` its ``ON DUPLICATE KEY``
upserts, ``transactions.py`` the retried transaction, ``sql.py`` the clock
and error codes they share.
"""

from __future__ import annotations

from .dialect import MysqlDialect

__all__ = ["MysqlDialect"]
