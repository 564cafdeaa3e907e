"""The dialect contract on sqlite: see ``tests/contract/mixin.py``."""

from __future__ import annotations

from tests.contract.mixin import DialectContract
from tests.helpers import sqlite_only

pytestmark = sqlite_only("the SQLite dialect's contract run")


class TestSqliteDialect(DialectContract):
    vendor = "sqlite"
