"""Batched deletes: how every prune runs, a short transaction per batch (``docs/scale.md``).

A mixin of ``Dialect`` (``base.py``), which supplies ``atomic_write`` and
``_rowcount``; MySQL overrides ``delete_batch`` (it refuses a ``LIMIT``ed
subquery on the table it deletes from).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from ..conf import app_settings

# A prune run (``in_batches``): at most this many batches, and no new batch
# once this long has passed, so one chore never holds up the claim loop.
PRUNE_MAX_BATCHES = 20
PRUNE_BUDGET_S = 5.0


class BatchedDeletes:
    """``in_batches`` and ``delete_batch``, over the dialect's transactions and cursor."""

    if TYPE_CHECKING:  # supplied by ``Dialect``

        def atomic_write(self) -> AbstractContextManager[Any]: ...

        def _rowcount(self, sql: str, params: Sequence[Any]) -> int: ...

    def in_batches(self, batch: Callable[[int], int], size: int | None = None) -> int:
        """Call ``batch(size)`` again and again, each call its own short write transaction.

        ``batch`` handles at most ``size`` rows (``PRUNE_BATCH_SIZE`` by
        default) and returns how many it handled; the run ends at the first
        short batch, after ``PRUNE_MAX_BATCHES`` batches or once
        ``PRUNE_BUDGET_S`` has passed (what is left waits for the next run).
        Short transactions keep row locks, SQLite's write lock and the
        PostgreSQL xmin horizon from being held by a long ``DELETE``. Returns
        the rows handled.
        """
        size = app_settings.prune_batch_size if size is None else size
        deadline = time.monotonic() + PRUNE_BUDGET_S
        total = 0
        for _ in range(PRUNE_MAX_BATCHES):
            with self.atomic_write():
                handled = batch(size)
            total += handled
            if handled < size or time.monotonic() >= deadline:
                break
        return total

    def delete_batch(
        self, table: str, key: str, where: str, params: Sequence[Any], order_by: str, limit: int
    ) -> int:
        """Delete at most ``limit`` rows of ``table`` matching ``where``, first by ``order_by``.

        An index led by ``where``'s equality columns, then ``order_by``, serves
        it: a batch reads the rows it deletes and no more. ``key`` is the
        primary key; ``params`` hold the run's cutoff (read once, database
        clock). Default: ``key IN (SELECT … ORDER BY … LIMIT)``; MySQL, which
        refuses that subquery on the table it deletes from, overrides it.
        """
        sql = (
            f"DELETE FROM {table} WHERE {key} IN (SELECT {key} FROM {table} WHERE {where} "
            f"ORDER BY {order_by} LIMIT %s)"
        )
        return self._rowcount(sql, [*params, limit])
