"""Workflows, their steps, and kept job results: what outlives a job's row."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from .. import records
from .jobs import NAME_MAX_LENGTH


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
    # The job's tags, as the job stored them (",a,b,").
    tags = models.TextField(null=True, blank=True)  # noqa: DJ001

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
            tags=records.split_tags(self.tags),
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
    # The trace context of its enqueue (``tracing``): each step released later
    # is enqueued under it, so one workflow is one trace.
    trace_context = models.TextField(null=True, blank=True)  # noqa: DJ001

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
