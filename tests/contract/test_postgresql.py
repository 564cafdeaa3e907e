"""The dialect contract on postgresql: see ``tests/contract/mixin.py``."""

from __future__ import annotations

from tests.conftest import postgres_only
from tests.contract.mixin import DialectContract

pytestmark = postgres_only("the PostgreSQL dialect's contract run")


class TestPostgresDialect(DialectContract):
    vendor = "postgresql"
