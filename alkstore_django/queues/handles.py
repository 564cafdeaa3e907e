"""The fenced handle a claim hands out: ack, retry, fail, heartbeat, release, snooze."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import transaction

from ..backoff import Backoff, check_backoff, retry_delay_s
from ..error_text import error_text
from ..records import Job
from ..validation import validate_duration

if TYPE_CHECKING:
    from .queue import Queue


def snoozed_out(job: Job) -> str:
    """Return the error of a job dead-lettered for snoozing past its ``max_snoozes``."""
    return f"snoozed {job.snoozes} times: its max_snoozes is {job.max_snoozes}"


class JobHandle:
    """A claim on one job, valid while the row is still under this very claim.

    Every operation on an invalid handle (lapsed, re-claimed, cancelled, or
    already spent) returns False and changes nothing. ``ack``, ``retry``,
    ``fail`` and ``release`` spend the handle.
    """

    def __init__(self, queue: Queue, job: Job) -> None:
        self.queue = queue
        self.job = job
        self._spent = False

    def __repr__(self) -> str:
        return f"<JobHandle job={self.job.id} attempt={self.job.attempts}>"

    @property
    def spent(self) -> bool:
        return self._spent

    def mark_spent(self) -> None:
        """Record that the job was settled elsewhere (a worker's batched ack)."""
        self._spent = True

    def _fence(self) -> tuple[int, int, str]:
        return self.job.id, self.job.generation, self.job.worker_id or ""

    def _spend(self, done: bool) -> bool:
        """Spend the handle once its operation is durable.

        Inside a transaction that is when it commits: an outcome rolled back
        with the caller's transaction leaves the handle usable, and the job
        still under this claim.
        """
        connection = transaction.get_connection(self.queue.store.using)
        if done and connection.in_atomic_block:
            transaction.on_commit(self.mark_spent, using=self.queue.store.using)
        else:
            self._spent = True
        return done

    def ack(self) -> bool:
        """Delete the job: it is done."""
        self.queue.store.check_open()
        if self._spent:
            return False
        return self._spend(self.queue.store.dialect.ack(*self._fence()))

    def retry(
        self,
        error: str | None = None,
        delay_s: float | None = None,
        *,
        backoff: Backoff | None = None,
    ) -> bool:
        """Back to pending after ``delay_s`` or the backoff; dead-letter when exhausted.

        Without ``delay_s`` the delay is ``backoff(attempt, error)`` (a
        handler's), else the queue's ``backoff`` option, else the
        equal-jitter curve; a backoff that fails falls back to the curve
        (``backoff.retry_delay_s``). The dead letter's error is ``error``
        (cleaned: no NUL, no lone surrogate, capped at 64 KiB), or 'max
        attempts exceeded'.
        """
        self.queue.store.check_open()
        if delay_s is not None:
            delay_s = validate_duration("delay_s", delay_s)
        if backoff is not None:
            check_backoff(backoff)
        error = None if error is None else error_text(error)
        if self._spent:
            return False
        dialect = self.queue.store.dialect
        if self.job.attempts >= self.job.max_attempts:
            reason = "max attempts exceeded" if error is None else error
            return self._spend(dialect.bury_claimed(*self._fence(), reason))
        if delay_s is None:
            delay_s = retry_delay_s(self.job, error, backoff, self.queue.options.backoff)
        return self._spend(dialect.requeue_claimed(*self._fence(), delay_s=delay_s, error=error))

    def fail(self, error: str | None = None) -> bool:
        """Dead-letter the job at once with ``error`` (cleaned, as for ``retry``), or 'failed'."""
        self.queue.store.check_open()
        error = None if error is None else error_text(error)
        if self._spent:
            return False
        reason = "failed" if error is None else error
        return self._spend(self.queue.store.dialect.bury_claimed(*self._fence(), reason))

    def cancel(self) -> bool:
        """Delete the job under this claim: it was cancelled while it ran (its unique key freed)."""
        self.queue.store.check_open()
        if self._spent:
            return False
        return self._spend(self.queue.store.dialect.cancel_claimed(*self._fence()))

    def heartbeat(self, extend_s: float, progress: dict[str, Any] | None = None) -> bool:
        """Reset the claim deadline to now + ``extend_s`` (absolute); False once it has passed.

        ``progress`` (a ``Run.take_progress`` value) is stored by the same
        statement, with the database's time as its ``progress_at``.
        """
        self.queue.store.check_open()
        extend_s = validate_duration("extend_s", extend_s, allow_zero=False)  # type: ignore[assignment]
        if self._spent:
            return False
        return self.queue.store.dialect.heartbeat(*self._fence(), extend_s, progress)

    def release(self) -> bool:
        """Back to pending at once, giving back the attempt the claim consumed."""
        self.queue.store.check_open()
        if self._spent:
            return False
        dialect = self.queue.store.dialect
        released = self._spend(dialect.requeue_claimed(*self._fence(), delay_s=None, error=None))
        if released:
            # Claimable now, and no enqueue announced it: an idle worker of
            # the queue would find it only at its poll.
            dialect.wake_for(self.queue.name, self.queue.channel)
        return released

    def snooze(self, delay_s: float) -> bool:
        """Put the job off: pending again after ``delay_s``, the claim's attempt given back.

        The job's ``snoozes`` count grows by one; past its ``max_snoozes`` (a
        queue option, 100 by default, stamped at enqueue) the job is
        dead-lettered instead, with an error saying so, so a job cannot snooze
        forever.
        """
        self.queue.store.check_open()
        delay_s = validate_duration("delay_s", delay_s)  # type: ignore[assignment]
        if self._spent:
            return False
        dialect = self.queue.store.dialect
        if self.job.snoozes >= self.job.max_snoozes:
            return self._spend(dialect.bury_claimed(*self._fence(), snoozed_out(self.job)))
        return self._spend(
            dialect.requeue_claimed(*self._fence(), delay_s=delay_s, error=None, snooze=True)
        )
