"""The Django Tasks backend's results."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from .jobs import NAME_MAX_LENGTH


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
