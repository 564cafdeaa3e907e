"""The SQLite engine: ``SqliteDialect`` and what it is made of.

``dialect.py`` the dialect (``BEGIN IMMEDIATE`` write transactions),
``watch.py`` its ``PRAGMA data_version`` watcher.
"""

from __future__ import annotations

from .dialect import SqliteDialect

__all__ = ["SqliteDialect"]
