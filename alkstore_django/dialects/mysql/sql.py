"""MariaDB/MySQL: the clock, the interval arithmetic and the error codes the engine's modules share.

A leaf of the engine's folder: the dialect, its upserts and its watcher all
import it, and it imports none of them.
"""

from __future__ import annotations

# Microseconds, and UTC whatever the session's time zone, as Django stores naive UTC.
NOW = "UTC_TIMESTAMP(6)"
# ER_LOCK_DEADLOCK, ER_LOCK_WAIT_TIMEOUT: the transaction lost a lock race.
RETRYABLE_ERRORS = frozenset({1213, 1205})
DUPLICATE_KEY = 1062  # ER_DUP_ENTRY


def plus(base: str, seconds: str) -> str:
    """Return SQL for the instant ``seconds`` (an SQL expression) after ``base``."""
    return f"TIMESTAMPADD(MICROSECOND, ROUND(({seconds}) * 1000000), {base})"


def error_code(exc: BaseException) -> int | None:
    """Return the server's error number carried by a driver exception, or None."""
    code = exc.args[0] if exc.args else None
    return code if isinstance(code, int) else None
