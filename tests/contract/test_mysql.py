"""The dialect contract on mysql: see ``tests/contract/mixin.py``."""

from __future__ import annotations

from tests.contract.mixin import DialectContract


class TestMysqlDialect(DialectContract):
    vendor = "mysql"
