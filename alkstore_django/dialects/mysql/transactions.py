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

    InnoDB rolls a deadlocked transaction back whole, so only a
    transaction of our own can be run again: inside the caller's
    ``atomic()`` block the error is the caller's. Our own is an explicit
    ``START TRANSACTION`` … ``COMMIT`` on the autocommit connection: two
    round trips, where ``atomic()`` takes three (autocommit off, commit,
    autocommit on), on the worker's every cycle.
    """
    if connection.in_atomic_block:
        with connection.cursor() as cursor:
            return body(cursor)
    for attempt in range(1, TRANSACTION_ATTEMPTS + 1):
        try:
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
        except OperationalError as exc:
            if error_code(exc) not in RETRYABLE_ERRORS or attempt == TRANSACTION_ATTEMPTS:
                raise
            logger.debug("retrying after lock conflict attempt=%d error=%s", attempt, exc)
            time.sleep(random.uniform(0, 0.005 * attempt))  # noqa: S311
    raise AssertionError("unreachable")  # pragma: no cover
