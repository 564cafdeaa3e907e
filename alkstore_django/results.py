"""Kept results: what became of a job enqueued with ``keep_result_s``, for that long.

A result is written in the transaction that decides the job's end (its ack,
its move to the dead letters, its cancel), so it exists exactly when that
end does. A requeued dead letter is live again: its result goes. The
workers' upkeep deletes results past their ``expires_at``.
"""

from __future__ import annotations

import functools
import json
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from .conf import app_settings
from .models import DeadJob, JobResult, ResultState
from .records import JobResult as JobResultRecord
from .records import join_tags, split_tags
from .validation import encode_payload, validate_int

if TYPE_CHECKING:
    from .records import Job
    from .store import Store

__all__ = ["encode_result", "forget", "get_result", "keep", "keep_acked", "keep_row", "prune"]


def encode_result(value: Any) -> Any:
    """Return ``value`` as it will be stored; raise ``PayloadError`` naming it when it is not JSON.

    Held to the payload's rules (strict JSON, ``MAX_PAYLOAD_BYTES``): a value
    that could not be read back the same is refused, and the attempt fails.
    """
    text = encode_payload(value, app_settings.max_payload_bytes, what="Return value")
    return json.loads(text)


def keep(
    store: Store,
    job: Job,
    state: ResultState,
    *,
    value: Any = None,
    error: str | None = None,
) -> None:
    """Write ``job``'s result, kept ``job.keep_result_s`` from now (database clock)."""
    keep_row(
        store,
        job.id,
        job.queue,
        job.attempts,
        job.keep_result_s,
        state,
        value,
        error,
        tags=join_tags(job.tags),
    )


def keep_acked(store: Store, acked: list[tuple[Job, Any]]) -> None:
    """Write the ``succeeded`` results of acked jobs and their return values, in one insert."""
    if not acked:
        return
    now = store.dialect.database_now()
    JobResult.objects.using(store.using).bulk_create(
        [
            JobResult(
                job_id=job.id,
                queue=job.queue,
                state=ResultState.SUCCEEDED,
                value=value,
                error=None,
                attempts=job.attempts,
                finished_at=now,
                expires_at=now + timedelta(seconds=job.keep_result_s or 0),
                tags=join_tags(job.tags),
            )
            for job, value in acked
        ],
        batch_size=1000,
    )


def keep_row(
    store: Store,
    job_id: int,
    queue: str,
    attempts: int,
    keep_result_s: float | None,
    state: ResultState,
    value: Any = None,
    error: str | None = None,
    *,
    tags: str | None = None,
) -> None:
    """Write the result of job ``job_id`` (``keep``'s fields one by one, for a row read raw).

    ``tags`` is the job's stored tags column (``",a,b,"``), copied as it is.
    """
    assert keep_result_s is not None
    now = store.dialect.database_now()
    JobResult.objects.using(store.using).create(
        job_id=job_id,
        queue=queue,
        state=state,
        value=value,
        error=error,
        attempts=attempts,
        finished_at=now,
        expires_at=now + timedelta(seconds=keep_result_s),
        tags=tags,
    )


def get_result(store: Store, job_id: int) -> JobResultRecord | None:
    """Return the kept result of job ``job_id``; None when unknown, still live, or expired.

    A job dead-lettered by a sweep (an expiry, a dead worker's last attempt)
    has no result row, as no outcome of its own moved it: its dead letter
    answers, kept as long as a result would be.
    """
    store.check_open()
    validate_int("job id", job_id, minimum=-(2**63), maximum=2**63 - 1)
    now = store.dialect.database_now()
    row = JobResult.objects.using(store.using).filter(job_id=job_id, expires_at__gt=now).first()
    if row is not None:
        return row.to_record()
    dead = DeadJob.objects.using(store.using).filter(id=job_id, keep_result_s__isnull=False).first()
    if dead is None or dead.keep_result_s is None:
        return None
    expires_at = dead.died_at + timedelta(seconds=dead.keep_result_s)
    if expires_at <= now:
        return None
    return JobResultRecord(
        job_id=dead.id,
        queue=dead.queue,
        state="failed",
        value=None,
        error=dead.last_error,
        attempts=dead.attempts,
        finished_at=dead.died_at,
        expires_at=expires_at,
        tags=split_tags(dead.tags),
    )


def forget(using: str, job_ids: list[int]) -> None:
    """Delete the results of jobs that are live again (requeued dead letters)."""
    JobResult.objects.using(using).filter(job_id__in=job_ids).delete()


def prune(store: Store) -> int:
    """Delete the results past their ``expires_at``, in batches; return how many.

    Oldest expiry first on ``alk_result_expiry``, ``PRUNE_BATCH_SIZE`` rows a
    statement (``Dialect.in_batches``); what a run leaves goes at the next.
    """
    dialect = store.dialect
    return dialect.in_batches(functools.partial(dialect.prune_results, dialect.database_now()))
