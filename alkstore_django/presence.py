"""Live workers: each worker announces itself every few seconds; silence means it is gone.

A queue with pending jobs and no live worker consuming it sits silently
otherwise; the overview flags it from these rows. Times are the database's
clock. A worker deletes its row when it stops (its sentinel does, when it
dies); a row not refreshed within ``WORKER_TTL_S`` belongs to a worker that
died with its sentinel, and is no longer listed.
"""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Sequence
from datetime import timedelta

from django.db.models.functions import Now

from .conf import app_settings
from .models import LiveWorker

# Rows this many TTLs old are deleted by the sweep.
PURGE_AFTER_TTLS = 10


def announce(
    using: str,
    worker_id: str,
    *,
    queues: Sequence[str],
    pool: str,
    concurrency: int,
    counts: tuple[int, int, int],
) -> None:
    """Write (or refresh) ``worker_id``'s row with its counts (acked, retried, dead) so far."""
    acked, retried, dead = counts
    LiveWorker.objects.using(using).update_or_create(
        worker_id=worker_id,
        defaults={"acked": acked, "retried": retried, "dead": dead, "last_seen_at": Now()},
        create_defaults={
            "host": socket.gethostname()[:255],
            "pid": os.getpid(),
            "queues": list(queues),
            "pool": pool,
            "concurrency": concurrency,
            "acked": acked,
            "retried": retried,
            "dead": dead,
        },
    )


def set_waiting(using: str, worker_id: str, waiting: bool) -> bool:
    """Say whether ``worker_id`` waits for wake-ups; return False when it has no row."""
    rows = LiveWorker.objects.using(using).filter(worker_id=worker_id).update(waiting=waiting)
    return bool(rows)


def leave(using: str, worker_id: str) -> None:
    """Delete ``worker_id``'s row: it has stopped."""
    LiveWorker.objects.using(using).filter(worker_id=worker_id).delete()


def live_workers(using: str) -> list[LiveWorker]:
    """Return the workers seen within ``WORKER_TTL_S``, by worker id."""
    cutoff = Now() - timedelta(seconds=app_settings.worker_ttl_s)
    rows = LiveWorker.objects.using(using).filter(last_seen_at__gte=cutoff)
    return list(rows.order_by("worker_id"))


def purge_gone(using: str) -> int:
    """Delete the rows of workers silent for ``PURGE_AFTER_TTLS`` TTLs; return the count."""
    from .dialects import dialect_for

    dialect = dialect_for(using)
    silent = timedelta(seconds=app_settings.worker_ttl_s * PURGE_AFTER_TTLS)
    cutoff = dialect.database_now() - silent
    return dialect.in_batches(functools.partial(dialect.purge_workers, cutoff))
