"""The live jobs' statements every engine speaks alike: a claim's handle, the sweeps, the counts.

A handle (ack, heartbeat, requeue, bury) is a statement fenced by the claim
it was given. The claim itself is each engine's ``claim_and_ack``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any

from ..records import Job as JobRecord
from .base import DEAD_TABLE, JOB_TABLE, WINDOW_TABLE, Dialect, marks

# A handle is valid while its row is still under the very claim it was given:
# the generation grows at every claim and nothing resets it.
FENCE = (
    "id = %s AND state = 'processing' AND generation = %s AND worker_id = %s "
    "AND claim_expires_at > {now}"
)
# Exhausted lapsed claims: a worker died after the job's last allowed claim.
EXHAUSTED_LAPSED = "state = 'processing' AND attempts >= max_attempts AND claim_expires_at <= {now}"


class ClaimStatements(Dialect):
    """The handle statements, the live-job sweeps and the queue's counts, written once."""

    def claim(self, queue: str, worker_id: str, n: int) -> list[JobRecord]:
        """Claim up to ``n`` jobs: ``claim_and_ack`` with nothing to ack."""
        return self.claim_and_ack(queue, worker_id, n, "", ())[1]

    def ack(self, job_id: int, generation: int, worker_id: str) -> bool:
        """Delete the job if it is still under this claim."""
        now, now_params = self.now_sql()
        sql = f"DELETE FROM {JOB_TABLE} WHERE {FENCE.format(now=now)}"
        return self._rowcount(sql, [job_id, generation, worker_id, *now_params]) == 1

    def heartbeat(
        self,
        job_id: int,
        generation: int,
        worker_id: str,
        extend_s: float,
        progress: dict[str, Any] | None = None,
    ) -> bool:
        """Reset the claim deadline to now + ``extend_s`` if the claim is still live.

        With ``progress`` the same statement stores it, stamped with the
        database clock: a handler's progress costs no round trip of its own.
        """
        now, now_params = self.now_sql()
        params: list[Any] = [*now_params, extend_s]
        written = ""
        if progress is not None:
            written = f", progress = {self.json_sql()}, progress_at = {now}"
            params += [json.dumps(progress), *now_params]
        sql = (
            f"UPDATE {JOB_TABLE} SET claim_expires_at = {self.plus_sql(now, '%s')}{written} "
            f"WHERE {FENCE.format(now=now)}"
        )
        params += [job_id, generation, worker_id, *now_params]
        return self._rowcount(sql, params) == 1

    def requeue_claimed(
        self,
        job_id: int,
        generation: int,
        worker_id: str,
        *,
        delay_s: float | None,
        error: str | None,
        snooze: bool = False,
    ) -> bool:
        """Put a claimed row back to pending.

        With ``delay_s`` it is a retry: due after the delay, the claim's attempt
        kept. Without, it is a release: due where it was, the attempt given back.
        A snooze is due after ``delay_s`` with the attempt given back and one
        more snooze counted. No assignment reads a column another one writes,
        so the statement means the same on MySQL, which applies assignments
        left to right.
        """
        now, now_params = self.now_sql()
        sets = ["state = 'pending'", "worker_id = NULL", "claim_expires_at = NULL"]
        params: list[Any] = []
        if error is not None:
            sets.append("last_error = %s")
            params.append(error)
        if delay_s is None or snooze:
            sets.append("attempts = attempts - 1")
        if snooze:
            sets.append("snoozes = snoozes + 1")
        if delay_s is not None:
            sets.append(f"run_at = {self.plus_sql(now, '%s')}")
            params += [*now_params, delay_s]
        sql = f"UPDATE {JOB_TABLE} SET {', '.join(sets)} WHERE {FENCE.format(now=now)}"
        return self._rowcount(sql, [*params, job_id, generation, worker_id, *now_params]) == 1

    def bury_claimed(self, job_id: int, generation: int, worker_id: str, error: str) -> bool:
        """Dead-letter the job with ``error`` if it is still under this claim."""
        return self.bury(FENCE, [job_id, generation, worker_id], error) == 1

    # --- sweeps -------------------------------------------------------------------------

    def expire(self, queue: str) -> int:
        """Dead-letter the queue's live rows past their expiry; return how many."""
        return self.bury("queue = %s AND expires_at <= {now}", [queue], "expired")

    def purge_windows(self, queue: str) -> int:
        """Delete the queue's ``unique_for_s`` windows that have ended; return how many.

        In batches (``in_batches``) on ``alk_unique_window_until`` (queue,
        held_until), the cutoff read once from the database clock.
        """
        at = self.adapt_datetime(self.database_now())
        return self.in_batches(
            functools.partial(
                self.delete_batch, WINDOW_TABLE, "id", "queue = %s AND held_until <= %s",
                [queue, at], "held_until",
            )
        )  # fmt: skip

    def bury_exhausted_lapsed(self) -> int:
        """Dead-letter every lapsed claim with no attempts left, whatever its queue.

        A claim on a queue buries that queue's exhausted lapsed claims (in its
        transaction, or on PostgreSQL right after it, once it saw one); this
        catches those of a queue that nobody claims from any more.
        """
        return self.bury(EXHAUSTED_LAPSED, [], "max attempts exceeded")

    # --- counts -------------------------------------------------------------------------

    def stats(self, queue: str) -> tuple[int, int, int, int, int, float | None]:
        """Return pending (ready), scheduled, processing, overdue, dead, oldest ready age."""
        now, now_params = self.now_sql()
        live = f"FROM {JOB_TABLE} WHERE queue = %s AND state ="
        sql = (
            f"SELECT (SELECT count(*) {live} 'pending' AND run_at <= {now}), "
            f"(SELECT count(*) {live} 'pending' AND run_at > {now}), "
            f"(SELECT count(*) {live} 'processing'), "
            f"(SELECT count(*) {live} 'processing' AND claim_expires_at <= {now}), "
            f"(SELECT count(*) FROM {DEAD_TABLE} WHERE queue = %s), "
            f"(SELECT min(run_at) {live} 'pending' AND run_at <= {now}), {now}"
        )
        params = [
            queue, *now_params,
            queue, *now_params,
            queue,
            queue, *now_params,
            queue,
            queue, *now_params,
            *now_params,
        ]  # fmt: skip
        row = self._fetchall(sql, params)[0]
        oldest, db_now = self.to_datetime(row[5]), self.to_datetime(row[6])
        age = (db_now - oldest).total_seconds() if oldest and db_now else None
        return int(row[0]), int(row[1]), int(row[2]), int(row[3]), int(row[4]), age

    def next_due_at(self, queues: Sequence[str]) -> float | None:
        """Return seconds until something in ``queues`` next becomes claimable.

        That is the soonest future ``run_at`` of a pending job or the soonest
        claim deadline of a processing one (a dead worker's job comes back
        then); None when there is neither. A future ``run_at`` is always past
        the job's ``enqueued_at`` (both from the database clock), which is what
        lets ``alk_job_due`` leave the jobs due at once out.
        """
        now, now_params = self.now_sql()
        queue_marks = marks(len(queues))
        sql = (
            f"SELECT (SELECT min(run_at) FROM {JOB_TABLE} WHERE queue IN ({queue_marks}) "
            f"AND state = 'pending' AND run_at > enqueued_at AND run_at > {now}), "
            f"(SELECT min(claim_expires_at) FROM {JOB_TABLE} WHERE queue IN ({queue_marks}) "
            f"AND state = 'processing' AND claim_expires_at > {now}), {now}"
        )
        row = self._fetchall(sql, [*queues, *now_params, *queues, *now_params, *now_params])[0]
        times = [t for t in (self.to_datetime(row[0]), self.to_datetime(row[1])) if t]
        return self._seconds_until(min(times), row[2]) if times else None
