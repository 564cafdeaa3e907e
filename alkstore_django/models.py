"""The tables. Declarative only: state changes live in the services as single statements."""

from __future__ import annotations

from datetime import datetime

from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Now

from . import records
from .conf import app_settings
from .specs import MISFIRE_CHOICES

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

    class Meta:
        abstract = True


class Job(JobStamps):
    """A live job: pending, or processing under a claim that ends at ``claim_expires_at``."""

    id = models.BigAutoField(primary_key=True)
    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.PENDING)
    claim_expires_at = models.DateTimeField(null=True, blank=True)

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
        return _job_record(self, state=self.state, claim_expires_at=self.claim_expires_at)


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


class ResultState(models.TextChoices):
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed"
    CANCELLED = "cancelled", "cancelled"


class JobResult(models.Model):
    """What became of a job enqueued with ``keep_result_s``, kept until ``expires_at``.

    Written in the transaction that acks the job, moves it to the dead letters
    or cancels it; deleted when its dead letter is requeued (the job is live
    again) and by the workers' upkeep once expired.
    """

    job_id = models.BigIntegerField(primary_key=True)
    queue = models.CharField(max_length=NAME_MAX_LENGTH)
    state = models.CharField(max_length=16, choices=ResultState.choices)
    value = models.JSONField(null=True, blank=True)
    error = models.TextField(null=True, blank=True)  # noqa: DJ001
    attempts = models.PositiveIntegerField()
    finished_at = models.DateTimeField()
    expires_at = models.DateTimeField()

    class Meta:
        verbose_name = "job result"
        indexes = [models.Index(fields=["expires_at"], name="alk_result_expiry")]
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=["succeeded", "failed", "cancelled"]),
                name="alk_result_state",
            ),
        ]

    def __str__(self) -> str:
        return f"result of job {self.job_id} ({self.state})"

    def to_record(self) -> records.JobResult:
        return records.JobResult(
            job_id=self.job_id,
            queue=self.queue,
            state=self.state,  # type: ignore[arg-type]
            value=self.value,
            error=self.error,
            attempts=self.attempts,
            finished_at=self.finished_at,
            expires_at=self.expires_at,
        )


class WorkflowState(models.TextChoices):
    RUNNING = "running", "running"
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed"
    CANCELLED = "cancelled", "cancelled"


class StepState(models.TextChoices):
    """A step's stored state; a step whose job is under a claim reads ``processing``."""

    WAITING = "waiting", "waiting"
    PENDING = "pending", "pending"
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed"
    CANCELLED = "cancelled", "cancelled"


class Workflow(models.Model):
    """A graph of steps; every change to it or its steps locks this row first.

    ``steps_open`` counts the steps not yet finished (waiting, pending or
    running): the workflow ends when it reaches 0. Locking the row first, in
    every transaction that changes a step, is what releases a step after N
    parallel parents exactly once, and it fixes one lock order (workflow,
    then job) so those transactions cannot deadlock.
    """

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=NAME_MAX_LENGTH, blank=True, default="")
    state = models.CharField(
        max_length=16, choices=WorkflowState.choices, default=WorkflowState.RUNNING
    )
    steps_total = models.PositiveIntegerField()
    steps_open = models.PositiveIntegerField()
    created_at = models.DateTimeField(db_default=Now())
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["state", "-id"], name="alk_workflow_state"),
            models.Index(fields=["finished_at"], name="alk_workflow_finished"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=["running", "succeeded", "failed", "cancelled"]),
                name="alk_workflow_state_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"workflow {self.id} ({self.state})"


class WorkflowStep(models.Model):
    """One step of a workflow: its job's stamps until it is released, then its job's id.

    ``after`` names the steps it waits on and ``dependants`` those that wait
    on it (both fixed at enqueue). ``blocked_by`` counts its parents not yet
    finished; ``upstream_failed`` says one of them failed or was cancelled.
    """

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="steps")
    name = models.CharField(max_length=NAME_MAX_LENGTH)
    queue = models.CharField(max_length=NAME_MAX_LENGTH)
    # The payload as its job will store it (the codec's JSON text).
    payload = models.TextField()
    options = models.JSONField(default=dict)
    after = models.JSONField(default=list)
    dependants = models.JSONField(default=list)
    run_on_upstream_failure = models.BooleanField(default=False)
    state = models.CharField(max_length=16, choices=StepState.choices)
    blocked_by = models.PositiveIntegerField()
    upstream_failed = models.BooleanField(default=False)
    job_id = models.BigIntegerField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(null=True, blank=True)  # noqa: DJ001
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "workflow step"
        constraints = [
            models.UniqueConstraint(fields=["workflow", "name"], name="alk_step_name"),
            models.CheckConstraint(
                condition=Q(state__in=["waiting", "pending", "succeeded", "failed", "cancelled"]),
                name="alk_step_state",
            ),
        ]
        indexes = [
            models.Index(fields=["job_id"], name="alk_step_job"),
            models.Index(fields=["state", "workflow"], name="alk_step_state_wf"),
        ]

    def __str__(self) -> str:
        return f"step {self.name} of workflow {self.workflow_id} ({self.state})"


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


class Schedule(models.Model):
    """A schedule; its stamps are resolved when it is registered.

    ``spec`` is the only boundary arithmetic stored (``specs.py`` reads it);
    ``interval_s`` is ``@every``'s interval, shown to operators, null for a
    cron. ``refused_from`` holds the oldest boundary whose fire was refused,
    so it stays due until it fires or an operator acts.
    """

    name = models.CharField(max_length=NAME_MAX_LENGTH, unique=True)
    spec = models.CharField(max_length=255)
    interval_s = models.PositiveBigIntegerField(null=True, blank=True)
    zone = models.CharField(max_length=64, default="UTC")
    misfire = models.CharField(
        max_length=8,
        choices=MISFIRE_CHOICES,
        default="all",
    )
    queue = models.CharField(max_length=NAME_MAX_LENGTH)
    payload = models.JSONField(null=True)
    priority = models.IntegerField()
    max_attempts = models.PositiveIntegerField()
    visibility_timeout_s = models.FloatField()
    retry_base_s = models.FloatField()
    expires_s = models.FloatField(null=True, blank=True)
    enabled = models.BooleanField(default=True)
    declared = models.BooleanField(default=False, help_text="Declared in ALKSTORE['SCHEDULES'].")
    next_run_at = models.DateTimeField()
    last_fired_at = models.DateTimeField(null=True, blank=True)
    refused_from = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(null=True, blank=True)  # noqa: DJ001
    last_error_at = models.DateTimeField(null=True, blank=True)
    admin_edited_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        indexes = [
            models.Index(fields=["next_run_at"], name="alk_sched_due", condition=Q(enabled=True)),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.spec} → {self.queue})"

    def to_record(self) -> records.Schedule:
        return records.Schedule(
            name=self.name,
            spec=self.spec,
            interval_s=self.interval_s,
            zone=self.zone,
            misfire=self.misfire,
            queue=self.queue,
            payload=app_settings.payload_codec.decode(self.payload),
            priority=self.priority,
            max_attempts=self.max_attempts,
            visibility_timeout_s=self.visibility_timeout_s,
            retry_base_s=self.retry_base_s,
            expires_s=self.expires_s,
            enabled=self.enabled,
            declared=self.declared,
            next_run_at=self.next_run_at,
            last_fired_at=self.last_fired_at,
            last_error=self.last_error,
            last_error_at=self.last_error_at,
            refused_from=self.refused_from,
            created_at=self.created_at,
            updated_at=self.updated_at,
        )


class ScheduleFire(models.Model):
    """The boundary a scheduled job was fired for, by job id (live, dead or run).

    A table of its own so the job tables and their statements stay as they
    are; the tick prunes rows whose boundary is older than ``FIRE_KEEP_DAYS``.
    """

    job_id = models.BigIntegerField(primary_key=True)
    schedule = models.CharField(max_length=NAME_MAX_LENGTH)
    boundary = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["boundary"], name="alk_fire_boundary")]

    def __str__(self) -> str:
        return f"job {self.job_id} fired by {self.schedule} for {self.boundary.isoformat()}"


class Lock(models.Model):
    """A named lease; ``fence`` grows every time the lock changes hands."""

    name = models.CharField(max_length=NAME_MAX_LENGTH, unique=True)
    owner = models.CharField(max_length=NAME_MAX_LENGTH)
    fence = models.PositiveBigIntegerField(default=1)
    expires_at = models.DateTimeField()
    acquired_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"lock {self.name} held by {self.owner}"


class QueueControl(models.Model):
    """A queue's durable controls: whether it is paused, and its rate window.

    One row per queue that was ever paused or claimed under a limit; a queue
    without a row runs unpaused. Every claim of the queue reads ``paused``
    inside its own statement, and a claim under ``max_running`` or ``rate``
    locks the row, so those claims take turns over every worker and host.
    """

    queue = models.CharField(max_length=NAME_MAX_LENGTH, primary_key=True)
    paused = models.BooleanField(db_default=False)
    # Who paused it, when, in the database's clock: shown on the overview.
    paused_at = models.DateTimeField(null=True, blank=True)
    # The open rate window: when it opened (its first start) and its starts so far.
    window_at = models.DateTimeField(null=True, blank=True)
    window_starts = models.PositiveIntegerField(db_default=0)

    class Meta:
        verbose_name = "queue control"

    def __str__(self) -> str:
        return f"queue {self.queue} ({'paused' if self.paused else 'running'})"


class ChannelMessage(models.Model):
    """A notification on SQLite, which has no NOTIFY: written in the sender's transaction."""

    id = models.BigAutoField(primary_key=True)
    channel = models.CharField(max_length=64)
    payload = models.TextField(blank=True, default="")
    created_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["channel", "id"], name="alk_msg_channel")]

    def __str__(self) -> str:
        return f"message {self.id} on {self.channel}"


class OutcomeMinute(models.Model):
    """Jobs finished per queue per minute, counted by workers one upsert per batch."""

    queue = models.CharField(max_length=NAME_MAX_LENGTH)
    minute = models.DateTimeField()
    acked = models.PositiveBigIntegerField(default=0)
    retried = models.PositiveBigIntegerField(default=0)
    dead = models.PositiveBigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["queue", "minute"], name="alk_outcome_minute")
        ]
        indexes = [models.Index(fields=["minute"], name="alk_outcome_by_minute")]

    def __str__(self) -> str:
        return f"{self.queue} at {self.minute:%H:%M}"


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


class LiveWorker(models.Model):
    """A running worker, as it last announced itself; gone once it stops announcing.

    Each worker writes its row every few seconds (``presence.py``) and deletes
    it when it stops; a row not refreshed within ``WORKER_TTL_S`` belongs to a
    worker that died, and is no longer listed.
    """

    worker_id = models.CharField(max_length=NAME_MAX_LENGTH, unique=True)
    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    queues = models.JSONField(default=list)
    pool = models.CharField(max_length=16)
    concurrency = models.PositiveIntegerField()
    acked = models.PositiveBigIntegerField(default=0)
    retried = models.PositiveBigIntegerField(default=0)
    dead = models.PositiveBigIntegerField(default=0)
    started_at = models.DateTimeField(db_default=Now())
    last_seen_at = models.DateTimeField(db_default=Now())

    class Meta:
        verbose_name = "live worker"
        indexes = [models.Index(fields=["last_seen_at"], name="alk_worker_seen")]

    def __str__(self) -> str:
        return self.worker_id


class TaskStatus(models.TextChoices):
    """The statuses of ``django.tasks.TaskResultStatus``, declared here for Django 5.2 too."""

    READY = "READY", "ready"
    RUNNING = "RUNNING", "running"
    FAILED = "FAILED", "failed"
    SUCCESSFUL = "SUCCESSFUL", "successful"


class TaskResult(models.Model):
    """The result of one Django Tasks job, under the job's own id.

    Written when an attempt starts and in the same transaction as the job's
    outcome; while the job is live its row, not this one, says READY or RUNNING.
    """

    id = models.BigIntegerField(primary_key=True)
    backend = models.CharField(max_length=NAME_MAX_LENGTH)
    queue = models.CharField(max_length=NAME_MAX_LENGTH)
    task_path = models.CharField(max_length=500)
    args = models.JSONField(default=list)
    kwargs = models.JSONField(default=dict)
    priority = models.IntegerField(default=0)
    run_after = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=TaskStatus.choices, default=TaskStatus.READY)
    return_value = models.JSONField(null=True, blank=True)
    errors = models.JSONField(default=list, blank=True)
    worker_ids = models.JSONField(default=list, blank=True)
    enqueued_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    last_attempted_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "task result"
        indexes = [
            # Retention: finished results of one backend, oldest first.
            models.Index(
                fields=["backend", "finished_at"],
                name="alk_taskres_retention",
                condition=Q(finished_at__isnull=False),
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=["READY", "RUNNING", "FAILED", "SUCCESSFUL"]),
                name="alk_taskres_status",
            ),
        ]

    def __str__(self) -> str:
        return f"task {self.id} {self.task_path} ({self.status})"
