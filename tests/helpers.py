"""Tiny helpers named after a state; they move timestamps against the database clock."""

from __future__ import annotations

from datetime import timedelta

from django.db.models.functions import Now

from alkstore_django.models import DeadJob, Job


def lapse_claim(job_id: int, seconds_ago: float = 1.0) -> None:
    """Put the claim deadline of a processing job in the past."""
    Job.objects.filter(id=job_id).update(claim_expires_at=Now() - timedelta(seconds=seconds_ago))


def make_due(job_id: int) -> None:
    """Make a pending job due now (a delayed job or a retry's backoff)."""
    Job.objects.filter(id=job_id).update(run_at=Now() - timedelta(milliseconds=1))


def expire_job(job_id: int) -> None:
    """Put a live job's expiry in the past."""
    Job.objects.filter(id=job_id).update(expires_at=Now() - timedelta(seconds=1))


def age_dead(job_id: int, seconds: float) -> None:
    """Make a dead letter ``seconds`` older."""
    DeadJob.objects.filter(id=job_id).update(died_at=Now() - timedelta(seconds=seconds))
