"""Schedules and the boundaries they fired for."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from .. import records
from ..conf import app_settings
from ..specs import MISFIRE_CHOICES
from .jobs import NAME_MAX_LENGTH


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
