"""Attempt history: every failed attempt's error, kept beside the job until it is gone.

A dead letter's ``last_error`` says why its last attempt failed; the attempts
before it often say more (a timeout, then a crash, then a refusal). Each
failure is written here in the transaction that records it, with the
traceback's tail, the worker and the time, through the same cleaning and cap
as every stored error (``failures.py``), the rule the Tasks backend's
``errors`` follow too.
"""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Count, Exists, OuterRef
from django.db.models.functions import Now

from .error_text import TIMED_OUT_PREFIX
from .models import Attempt, DeadJob, Job
from .records import Job as JobRecord

# An acked job's history is dropped by the sweep once it is this old.
ORPHAN_AGE_S = 3_600
PURGE_BATCH = 5_000
# The overview counts time-outs over this window.
TIMEOUTS_WINDOW_S = 3_600


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


def purge_orphaned_attempts(using: str, now_minus_s: float = ORPHAN_AGE_S) -> int:
    """Delete the history of jobs that are gone (acked, or their dead letter purged).

    Only rows older than ``now_minus_s`` go, in batches of ``PURGE_BATCH``;
    returns how many went. The age is read on the database's clock.
    """
    orphans = (
        Attempt.objects.using(using)
        .filter(failed_at__lt=Now() - timedelta(seconds=now_minus_s))
        .exclude(Exists(Job.objects.using(using).filter(id=OuterRef("job_id"))))
        .exclude(Exists(DeadJob.objects.using(using).filter(id=OuterRef("job_id"))))
    )
    ids = list(orphans.values_list("id", flat=True)[:PURGE_BATCH])
    if not ids:
        return 0
    deleted, _ = Attempt.objects.using(using).filter(id__in=ids).delete()
    return deleted
