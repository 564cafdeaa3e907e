"""The dialect contract on sqlite: see ``tests/contract/mixin.py``."""

from __future__ import annotations

from tests.contract.mixin import DialectContract


class TestSqliteDialect(DialectContract):
    vendor = "sqlite"
