"""The dialect contract on postgresql: see ``tests/contract/mixin.py``."""

from __future__ import annotations

from tests.contract.mixin import DialectContract


class TestPostgresDialect(DialectContract):
    vendor = "postgresql"
