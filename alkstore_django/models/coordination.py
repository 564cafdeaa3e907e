"""What workers share beside the jobs: leases, queue controls, messages, counters, presence."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now

from .jobs import NAME_MAX_LENGTH


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
    # Under ``max_running_per_key``: the last key a claim considered, so that
    # the next claim goes on from the key after it and every key takes its turn.
    key_cursor = models.CharField(max_length=NAME_MAX_LENGTH, null=True, blank=True)  # noqa: DJ001

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
    # True while the worker would claim on a wake-up (its last claim left its
    # queues drained): producers on PostgreSQL send a queue's NOTIFY only
    # while a worker of the queue waits (``dialects/postgresql/wakeups.py``).
    # True by default, so a row written by a worker that never clears it is
    # always woken.
    waiting = models.BooleanField(default=True, db_default=True)

    class Meta:
        verbose_name = "live worker"
        indexes = [models.Index(fields=["last_seen_at"], name="alk_worker_seen")]

    def __str__(self) -> str:
        return self.worker_id
