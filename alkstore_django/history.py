"""Attempt history: every failed attempt's error, kept beside the job until it is gone.

A dead letter's ``last_error`` says why its last attempt failed; the attempts
before it often say more (a timeout, then a crash, then a refusal). Each
failure is written here in the transaction that records it, with the
traceback's tail, the worker and the time, through the same cleaning and cap
as every stored error (``failures.py``), the rule the Tasks backend's
``errors`` follow too.

The history leaves with its job, never by a scan of what is kept: a dead
letter's goes in the same transaction as the dead letter (its purge, its
delete); a job that failed before it was acked has its history deleted by
the worker once the ack has committed (``forget_acked``). What another path
leaves behind (a cancel, a handle acked outside a worker) is found by
``OrphanSweep``, a rare walk of the table by id that reads each row once a
pass, not once a run.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

from django.db.models import Count
from django.db.models.functions import Now

from .error_text import TIMED_OUT_PREFIX
from .models import Attempt
from .records import Job as JobRecord

# The overview counts time-outs over this window.
TIMEOUTS_WINDOW_S = 3_600
# How often the leader's orphan sweep goes on with its walk: a safety net.
ORPHAN_SWEEP_INTERVAL_S = 3_600.0


def record_attempt(
    using: str,
    job: JobRecord,
    error: str,
    exception_class: str | None = None,
    traceback: str | None = None,
) -> None:
    """Add ``job``'s current attempt to its history (texts already cleaned and capped)."""
    Attempt.objects.using(using).create(
        job_id=job.id,
        queue=job.queue,
        attempt=job.attempts,
        error=error,
        exception_class=exception_class or "",
        traceback=traceback or "",
        worker_id=job.worker_id or "",
    )


def attempts_of(job_id: int, using: str) -> list[Attempt]:
    """Return ``job_id``'s failed attempts, oldest first."""
    return list(Attempt.objects.using(using).filter(job_id=job_id).order_by("attempt", "id"))


def recent_timeouts(using: str, within_s: float = TIMEOUTS_WINDOW_S) -> dict[str, int]:
    """Return, per queue, how many attempts were stopped at their time limit lately."""
    rows = (
        Attempt.objects.using(using)
        .filter(
            failed_at__gte=Now() - timedelta(seconds=within_s),
            error__startswith=TIMED_OUT_PREFIX,
        )
        .values("queue")
        .annotate(n=Count("id"))
        .order_by()
    )
    return {row["queue"]: row["n"] for row in rows}


def forget_acked(using: str, jobs: Iterable[JobRecord]) -> int:
    """Delete the history of acked ``jobs`` that had failed before; return how many rows went.

    Only a job claimed more than once (``attempts > 1`` as it was acked) can
    have a history, so a batch of jobs that never failed costs no statement.
    Called once the ack has committed: a rolled-back ack keeps its history.
    """
    ids = [job.id for job in jobs if job.attempts > 1]
    if not ids:
        return 0
    deleted, _ = Attempt.objects.using(using).filter(job_id__in=ids).delete()
    return deleted


class OrphanSweep:
    """The safety net: walk the attempt table by id, deleting rows whose job is gone.

    Each run goes on from where the last one stopped (``after_id``), reads at
    most ``in_batches``' cap of rows (a primary-key range and two primary-key
    probes per row: ``Dialect.attempts_after``) and deletes the orphans among
    them in the same short transaction. At the end of the table the pass is
    over and the next run starts again from the lowest id. So a kept row
    (a dead letter's history) is read once a pass, never on every run. The
    position is the leader's, in memory: a new leader starts a new pass.
    """

    def __init__(self) -> None:
        self.after_id = 0
        # Rows read and deleted by the last run (what the tests and the log read).
        self.read = 0
        self.deleted = 0

    def run(self, using: str, size: int | None = None) -> int:
        """Go on with the walk for one run; return how many orphans were deleted."""
        from .dialects import dialect_for

        dialect = dialect_for(using)
        self.deleted = 0

        def batch(limit: int) -> int:
            rows = dialect.attempts_after(self.after_id, limit)
            orphans = [attempt_id for attempt_id, kept in rows if not kept]
            if orphans:
                self.deleted += dialect.delete_attempts(orphans)
            # A short read is the end of the table: the next run starts a new pass.
            self.after_id = rows[-1][0] if len(rows) == limit else 0
            return len(rows)

        self.read = dialect.in_batches(batch, size)
        return self.deleted
