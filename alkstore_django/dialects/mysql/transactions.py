"""MariaDB/MySQL: our own transactions, run again when they lose a lock race."""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import DatabaseError, OperationalError

from .sql import RETRYABLE_ERRORS, error_code

logger = logging.getLogger("alkstore_django.dialects.mysql")

TRANSACTION_ATTEMPTS = 5

T = TypeVar("T")


def run_in_transaction(connection: Any, body: Callable[[Any], T]) -> T:
    """Run ``body(cursor)`` in a transaction, retried when it loses a lock race.

    Our own transaction is an explicit ``START TRANSACTION`` … ``COMMIT`` on
    the autocommit connection: two round trips, where ``atomic()`` takes
    three (autocommit off, commit, autocommit on), on the worker's every cycle.
    """
    if connection.in_atomic_block:
        with connection.cursor() as cursor:
            return body(cursor)

    def attempt() -> T:
        with connection.cursor() as cursor:
            cursor.execute("START TRANSACTION")
            try:
                result = body(cursor)
            except BaseException:
                with contextlib.suppress(DatabaseError):
                    cursor.execute("ROLLBACK")
                raise
            cursor.execute("COMMIT")
            return result

    return retry_lock_races(connection, attempt)


def retry_lock_races(connection: Any, attempt: Callable[[], T]) -> T:
    """Call ``attempt()``, a whole transaction of ours, again when it loses a lock race.

    InnoDB rolls a deadlocked transaction back whole, so only a
    transaction of our own can be run again: inside the caller's
    ``atomic()`` block the error is the caller's, and ``attempt`` runs once.
    """
    if connection.in_atomic_block:
        return attempt()
    for n in range(1, TRANSACTION_ATTEMPTS + 1):
        try:
            return attempt()
        except OperationalError as exc:
            if error_code(exc) not in RETRYABLE_ERRORS or n == TRANSACTION_ATTEMPTS:
                raise
            logger.debug("retrying after lock conflict attempt=%d error=%s", n, exc)
            time.sleep(random.uniform(0, 0.005 * n))  # noqa: S311
    raise AssertionError("unreachable")  # pragma: no cover
