"""Unique jobs: a key held by its live job, then by its ``UniqueWindow``, written once.

Each engine's ``insert_unique`` writes the rows whose key is free; the rest
(the holders, the windows, the retry when a holder leaves in between) is the
same on every engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from ..records import EnqueueStamps
from .base import DEAD_TABLE, JOB_TABLE, WINDOW_TABLE, Dialect, marks


class UniqueJobs(Dialect):
    """``enqueue_unique`` over the engine's ``insert_unique``."""

    #: Appended to the read of a taken key's holder; see ``MysqlDialect``.
    holder_read_lock: ClassVar[str] = ""
    #: Appended to the read of the keys' windows; see ``MysqlDialect``.
    window_read_lock: ClassVar[str] = ""

    def enqueue_unique(
        self,
        stamps: EnqueueStamps,
        keyed: dict[str, str],
        unique_for_s: float | None,
    ) -> dict[str, tuple[int, bool]]:
        """Enqueue a job per (distinct unique key, payload) unless its key is taken.

        Returns {key: (id, created)}: the new job's id, or the id of the job
        holding the key. A key is held by the live job that has it (the
        ``alk_job_unique`` index decides, so concurrent enqueues of one key
        write one row) and, once that job has left, by its ``UniqueWindow``
        until ``held_until`` unless it was dead-lettered. The window is read
        after our own row is in: by then a holder that committed before us
        is visible, so no enqueue slips between a holder's ack and its
        window. With ``unique_for_s``, each new job's window is written too.
        One transaction, joining the caller's: a rollback frees the keys.
        """
        result: dict[str, tuple[int, bool]] = {}
        created: dict[str, int] = {}
        with self.write_transaction() as cursor:
            waiting = dict(keyed)
            while waiting:
                written = self.insert_unique(cursor, stamps, waiting)
                created.update(written)
                taken = [key for key in waiting if key not in written]
                holders = self._live_holders(cursor, stamps.queue, taken) if taken else {}
                for key, job_id in holders.items():
                    result[key] = (job_id, False)
                # A key neither written nor held: its holder left in between; try again.
                waiting = {
                    k: p for k, p in waiting.items() if k not in written and k not in holders
                }
            held = self._window_holders(cursor, stamps.queue, list(created)) if created else {}
            if held:
                ids, params = self.ids_sql([created.pop(key) for key in held])
                cursor.execute(f"DELETE FROM {JOB_TABLE} WHERE {ids}", params)
                result.update((key, (job_id, False)) for key, job_id in held.items())
            if created and unique_for_s is not None:
                self._write_windows(cursor, stamps.queue, created, unique_for_s)
            if created and self.supports_listen_notify:
                self.notify(stamps.channel, "")
        result.update((key, (job_id, True)) for key, job_id in created.items())
        return result

    def _live_holders(self, cursor: Any, queue: str, keys: Sequence[str]) -> dict[str, int]:
        """Return {key: id} of the live jobs of ``queue`` that hold ``keys``."""
        cursor.execute(
            f"SELECT unique_key, id FROM {JOB_TABLE} WHERE queue = %s "
            f"AND unique_key IN ({marks(len(keys))}){self.holder_read_lock}",
            [queue, *keys],
        )
        return {key: job_id for key, job_id in cursor.fetchall()}

    def _window_holders(self, cursor: Any, queue: str, keys: Sequence[str]) -> dict[str, int]:
        """Return {key: job id} of the unexpired windows on ``keys`` whose job is not dead."""
        now, now_params = self.now_sql()
        cursor.execute(
            f"SELECT w.unique_key, w.job_id FROM {WINDOW_TABLE} w WHERE w.queue = %s "
            f"AND w.unique_key IN ({marks(len(keys))}) AND w.held_until > {now} "
            f"AND NOT EXISTS (SELECT 1 FROM {DEAD_TABLE} d WHERE d.id = w.job_id)"
            f"{self.window_read_lock}",
            [queue, *keys, *now_params],
        )
        return {key: job_id for key, job_id in cursor.fetchall()}

    def _write_windows(
        self, cursor: Any, queue: str, created: dict[str, int], unique_for_s: float
    ) -> None:
        """Hold each new job's key until its ``enqueued_at`` + ``unique_for_s``.

        A key's old window (expired, or of a dead job) is replaced.
        """
        keys = list(created)
        cursor.execute(
            f"DELETE FROM {WINDOW_TABLE} WHERE queue = %s AND unique_key IN ({marks(len(keys))})",
            [queue, *keys],
        )
        ids, params = self.ids_sql(list(created.values()))
        cursor.execute(
            f"INSERT INTO {WINDOW_TABLE} (queue, unique_key, job_id, held_until) "
            f"SELECT queue, unique_key, id, {self.plus_sql('enqueued_at', '%s')} "
            f"FROM {JOB_TABLE} WHERE {ids}",
            [float(unique_for_s), *params],
        )
