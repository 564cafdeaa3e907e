"""The dialect contract on sqlite: see ``tests/contract/mixin.py``."""

from __future__ import annotations

from tests.conftest import sqlite_only
from tests.contract.mixin import DialectContract

pytestmark = sqlite_only("the SQLite dialect's contract run")


class TestSqliteDialect(DialectContract):
    vendor = "sqlite"
