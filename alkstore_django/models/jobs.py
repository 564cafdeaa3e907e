"""Live jobs, dead letters, unique windows and failed attempts: a job from enqueue to its end."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Now

from .. import records
from ..conf import app_settings

NAME_MAX_LENGTH = 200


class JobState(models.TextChoices):
    PENDING = "pending", "pending"
    PROCESSING = "processing", "processing"


def _job_record(
    row: JobStamps,
    *,
    state: str,
    claim_expires_at: datetime | None = None,
    died_at: datetime | None = None,
    **extra: Any,
) -> records.Job:
    """Build the API's Job from a live row or a dead letter (they share these fields)."""
    return records.Job(
        id=row.pk,
        queue=row.queue,
        payload=app_settings.payload_codec.decode(row.payload),
        priority=row.priority,
        run_at=row.run_at,
        attempts=row.attempts,
        max_attempts=row.max_attempts,
        generation=row.generation,
        timeout_s=row.timeout_s,
        snoozes=row.snoozes,
        max_snoozes=row.max_snoozes,
        unique_key=row.unique_key,
        visibility_timeout_s=row.visibility_timeout_s,
        retry_base_s=row.retry_base_s,
        expires_at=row.expires_at,
        state=state,  # type: ignore[arg-type]
        worker_id=row.worker_id,
        claim_expires_at=claim_expires_at,
        last_error=row.last_error,
        enqueued_at=row.enqueued_at,
        died_at=died_at,
        workflow_id=row.workflow_id,
        step=row.step,
        keep_result_s=row.keep_result_s,
        concurrency_key=row.concurrency_key or None,
        tags=records.split_tags(row.tags),
        trace_context=row.trace_context,
        **extra,
    )


class JobQuerySet(models.QuerySet):
    def pending(self) -> JobQuerySet:
        return self.filter(state=JobState.PENDING)

    def processing(self) -> JobQuerySet:
        return self.filter(state=JobState.PROCESSING)


class JobStamps(models.Model):
    """The columns a job keeps from enqueue to dead letter (the SPEC's Job, less its state)."""

    queue = models.CharField(max_length=NAME_MAX_LENGTH)
    payload = models.JSONField(null=True)
    priority = models.IntegerField(default=0)
    run_at = models.DateTimeField()
    attempts = models.PositiveIntegerField(default=0)
    # How many claims the job has had, ever: the fence of a handle. Unlike
    # attempts, nothing resets it (a requeue from the dead letters included),
    # so an old handle can never match a later claim.
    generation = models.PositiveBigIntegerField(db_default=0)
    # The run time limit of each attempt, in seconds; null means none.
    timeout_s = models.FloatField(null=True, blank=True)
    # How often a handler put the job off (``Snooze``) without spending an attempt,
    # and how often it may before it is dead-lettered.
    snoozes = models.PositiveIntegerField(db_default=0)
    max_snoozes = models.PositiveIntegerField(db_default=100)
    # At most one live job per (queue, unique_key); null for the common job without one.
    unique_key = models.CharField(max_length=NAME_MAX_LENGTH, null=True, blank=True)  # noqa: DJ001
    max_attempts = models.PositiveIntegerField()
    visibility_timeout_s = models.FloatField()
    retry_base_s = models.FloatField()
    expires_at = models.DateTimeField(null=True, blank=True)
    worker_id = models.CharField(max_length=NAME_MAX_LENGTH, null=True, blank=True)  # noqa: DJ001
    last_error = models.TextField(null=True, blank=True)  # noqa: DJ001
    enqueued_at = models.DateTimeField()
    # The workflow and step the job runs for; null for a plain job.
    workflow_id = models.BigIntegerField(null=True, blank=True)
    step = models.CharField(max_length=NAME_MAX_LENGTH, null=True, blank=True)  # noqa: DJ001
    # How long its result is kept once it has finished; null: not kept.
    keep_result_s = models.FloatField(null=True, blank=True)
    # At most the queue's ``max_running_per_key`` jobs of one key run at once; null: no key.
    concurrency_key = models.CharField(max_length=NAME_MAX_LENGTH, null=True, blank=True)  # noqa: DJ001
    # The job's tags as ",a,b,": a tag is matched with one LIKE on every engine.
    tags = models.TextField(null=True, blank=True)  # noqa: DJ001
    # The trace context of its enqueue (JSON of the propagator's carrier, W3C
    # traceparent by default) when a tracer provider was set; its runs' parent.
    trace_context = models.TextField(null=True, blank=True)  # noqa: DJ001

    class Meta:
        abstract = True


class Job(JobStamps):
    """A live job: pending, or processing under a claim that ends at ``claim_expires_at``."""

    id = models.BigAutoField(primary_key=True)
    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.PENDING)
    claim_expires_at = models.DateTimeField(null=True, blank=True)
    # When ``Store.cancel_job`` asked the running handler to stop (durable:
    # a worker that missed the notification reads it again).
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    # The handler's last reported progress (JSON: done, total, note) and when
    # it was written, by the database clock.
    progress = models.JSONField(null=True, blank=True)
    progress_at = models.DateTimeField(null=True, blank=True)

    objects = JobQuerySet.as_manager()

    class Meta:
        verbose_name = "live job"
        indexes = [
            # The claim: an ordered index scan over one queue's pending rows.
            models.Index(
                fields=["queue", "-priority", "run_at", "id"],
                name="alk_job_claim",
                condition=Q(state="pending"),
            ),
            # The soonest due time of a delayed or retried job, which an idle
            # worker sleeps until. A job due at once (run_at = enqueued_at, the
            # common enqueue) is left out: one index entry fewer per enqueue.
            models.Index(
                fields=["queue", "run_at"],
                name="alk_job_due",
                condition=Q(state="pending", run_at__gt=F("enqueued_at")),
            ),
            # The lapsed-claim sweep that runs before every claim.
            models.Index(
                fields=["queue", "claim_expires_at"],
                name="alk_job_lapse",
                condition=Q(state="processing"),
            ),
            models.Index(
                fields=["queue", "expires_at"],
                name="alk_job_expiry",
                condition=Q(expires_at__isnull=False),
            ),
            # A keyed claim: the keys with pending jobs, then each key's next
            # jobs. MariaDB/MySQL get it unconditioned from ``prepare_schema``.
            models.Index(
                fields=["queue", "concurrency_key", "-priority", "run_at", "id"],
                name="alk_job_key",
                condition=Q(state="pending", concurrency_key__isnull=False),
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=["pending", "processing"]), name="alk_job_state"
            ),
            models.CheckConstraint(condition=Q(max_attempts__gte=1), name="alk_job_max_attempts"),
            models.CheckConstraint(
                condition=Q(visibility_timeout_s__gt=0), name="alk_job_visibility"
            ),
            models.CheckConstraint(
                condition=Q(state="pending") | Q(claim_expires_at__isnull=False),
                name="alk_job_claim_deadline",
            ),
            # Every row of this table is live (pending or processing): a dead
            # job moves to DeadJob, an acked one is deleted. So "one live job
            # per key" is a unique index over the rows that have a key.
            # MariaDB/MySQL, without partial indexes, get the same index
            # unconditioned from ``prepare_schema`` (their NULLs never clash).
            models.UniqueConstraint(
                fields=["queue", "unique_key"],
                name="alk_job_unique",
                condition=Q(unique_key__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"job {self.id} on {self.queue} ({self.state})"

    def to_record(self) -> records.Job:
        return _job_record(
            self,
            state=self.state,
            claim_expires_at=self.claim_expires_at,
            cancel_requested_at=self.cancel_requested_at,
            progress=records.Progress.from_stored(self.progress, self.progress_at),
        )


class DeadJob(JobStamps):
    """A dead letter: the job under the id it had while live, with why it died."""

    id = models.BigIntegerField(primary_key=True)
    died_at = models.DateTimeField()

    class Meta:
        verbose_name = "dead letter"
        permissions = [("requeue_deadjob", "Can requeue dead letters")]
        indexes = [
            models.Index(fields=["queue", "died_at"], name="alk_dead_queue_died"),
            models.Index(fields=["died_at"], name="alk_dead_died"),
        ]

    def __str__(self) -> str:
        return f"dead job {self.id} on {self.queue}"

    def to_record(self) -> records.Job:
        return _job_record(self, state="dead", died_at=self.died_at)


class UniqueWindow(models.Model):
    """A unique key held past its job's success: taken until ``held_until``.

    Written with a job enqueued with ``unique_for_s`` (``held_until`` is its
    ``enqueued_at`` plus the window), in the enqueue's transaction. While the
    job is live the job's own key holds; afterwards this row does, unless the
    job was dead-lettered. Expired rows are deleted by the workers' sweep.
    """

    queue = models.CharField(max_length=NAME_MAX_LENGTH)
    unique_key = models.CharField(max_length=NAME_MAX_LENGTH)
    job_id = models.BigIntegerField()
    held_until = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["queue", "unique_key"], name="alk_unique_window")
        ]
        indexes = [
            models.Index(fields=["queue", "held_until"], name="alk_unique_window_until"),
            models.Index(fields=["job_id"], name="alk_unique_window_job"),
        ]

    def __str__(self) -> str:
        return f"key {self.unique_key!r} on {self.queue} until {self.held_until}"


class QueueOverview(Job):
    """No table of its own: the queue overview's entry on the admin index.

    Django's admin index lists models only; this proxy gives the overview
    page a row there. It has no permissions: the overview needs
    ``view_deadjob`` or ``view_job``.
    """

    class Meta:
        proxy = True
        verbose_name = "queue overview"
        verbose_name_plural = "queue overview"
        default_permissions = ()


class Attempt(models.Model):
    """One failed attempt of a job: the error history a dead letter is read with.

    Written in the transaction that records the failure, so it exists exactly
    when the failure does. Rows of jobs that are gone (acked, or dead letters
    purged) are deleted by the workers' sweep.
    """

    job_id = models.BigIntegerField()
    queue = models.CharField(max_length=NAME_MAX_LENGTH)
    attempt = models.PositiveIntegerField()
    error = models.TextField()
    exception_class = models.CharField(max_length=500, blank=True, default="")
    traceback = models.TextField(blank=True, default="")
    worker_id = models.CharField(max_length=NAME_MAX_LENGTH, blank=True, default="")
    failed_at = models.DateTimeField(db_default=Now())

    class Meta:
        indexes = [
            models.Index(fields=["job_id", "attempt"], name="alk_attempt_job"),
            models.Index(fields=["failed_at"], name="alk_attempt_failed"),
            # The overview's "timed out in the last hour" per queue.
            models.Index(fields=["queue", "failed_at"], name="alk_attempt_queue"),
        ]

    def __str__(self) -> str:
        return f"job {self.job_id} attempt {self.attempt}"
