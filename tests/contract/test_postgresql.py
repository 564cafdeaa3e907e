"""The dialect contract on postgresql: see ``tests/contract/mixin.py``."""

from __future__ import annotations

from tests.contract.mixin import DialectContract
from tests.helpers import postgres_only

pytestmark = postgres_only("the PostgreSQL dialect's contract run")


class TestPostgresDialect(DialectContract):
    vendor = "postgresql"
