"""Throughput: jobs finished per minute, cheap counters written by workers, read by the chart.

Workers call ``record_throughput`` at most once a second: one upsert statement
adds the counts since to the current minute's row of each queue (the minute is
the database clock's). Rows older than ``THROUGHPUT_RETENTION_S`` (a day) are
pruned in batches by the upkeep leader (``worker/upkeep.py``), once an hour.

The chart's dead-lettered series is counted from ``DeadJob.died_at`` (indexed),
not from the counters: jobs also die outside a worker's batch (the expiry
sweep, a lapsed claim buried by the next claimant), and those must show. The
cost is that a dead letter requeued or deleted within the hour leaves the
chart. The finished series is the workers' ``acked`` counter.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import Count, Sum
from django.db.models.functions import TruncMinute

from .conf import app_settings
from .errors import InvalidArgument
from .validation import validate_int

PRUNE_INTERVAL_S = 3_600
MAX_CHART_MINUTES = 1_440


@dataclass(frozen=True)
class ThroughputMinute:
    """One minute of throughput over every queue; ``minute`` is its start (UTC)."""

    minute: datetime
    acked: int
    retried: int
    dead: int


def record_throughput(using: str, counts: Mapping[str, tuple[int, int, int]]) -> None:
    """Add ``(acked, retried, dead)`` per queue to the current minute, in one upsert.

    Queues whose three counts are zero are skipped; nothing is written when all
    are. Joins the caller's transaction, if any. Raises ``InvalidArgument`` for
    a count that is not a non-negative integer.
    """
    from .dialects import dialect_for

    rows = []
    for queue, triple in counts.items():
        acked, retried, dead = (validate_int("outcome count", n, minimum=0) for n in triple)
        if acked or retried or dead:
            rows.append((queue, acked, retried, dead))
    if not rows:
        return
    dialect_for(using).record_outcomes(rows)


def prune_throughput(using: str, keep_s: float | None = None) -> int:
    """Delete counters older than ``keep_s`` (``THROUGHPUT_RETENTION_S``); return how many."""
    from .dialects import dialect_for

    dialect = dialect_for(using)
    keep = app_settings.throughput_retention_s if keep_s is None else keep_s
    cutoff = dialect.database_now() - timedelta(seconds=keep)
    return dialect.in_batches(functools.partial(dialect.prune_outcomes, cutoff))


def recent_throughput(using: str, minutes: int = 60) -> list[ThroughputMinute]:
    """Return the last ``minutes`` minutes, oldest first, the current one included.

    Minutes with nothing recorded are present with zeros. Two grouped queries:
    one over the counters, one over ``DeadJob.died_at``.
    """
    from .dialects import dialect_for
    from .models import DeadJob, OutcomeMinute

    if not isinstance(minutes, int) or not 1 <= minutes <= MAX_CHART_MINUTES:
        raise InvalidArgument(
            f"Invalid minutes {minutes!r}: expected an integer from 1 to {MAX_CHART_MINUTES}."
        )
    now = dialect_for(using).database_now().astimezone(UTC)
    end = now.replace(second=0, microsecond=0)
    start = end - timedelta(minutes=minutes - 1)
    counters = (
        OutcomeMinute.objects.using(using)
        .filter(minute__gte=start)
        .values("minute")
        .annotate(n_acked=Sum("acked"), n_retried=Sum("retried"))
        .order_by()
    )
    finished: dict[datetime, dict[str, Any]] = {_utc(row["minute"]): dict(row) for row in counters}
    died = (
        DeadJob.objects.using(using)
        .filter(died_at__gte=start)
        .annotate(m=TruncMinute("died_at", tzinfo=UTC))
        .values("m")
        .annotate(n=Count("id"))
        .order_by()
    )
    dead = {_utc(row["m"]): row["n"] for row in died}
    buckets = []
    for i in range(minutes):
        minute = start + timedelta(minutes=i)
        row = finished.get(minute, {})
        buckets.append(
            ThroughputMinute(
                minute=minute,
                acked=int(row.get("n_acked") or 0),
                retried=int(row.get("n_retried") or 0),
                dead=int(dead.get(minute, 0)),
            )
        )
    return buckets


def _utc(value: datetime) -> datetime:
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)
