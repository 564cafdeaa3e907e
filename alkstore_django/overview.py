"""The queue overview: every queue's counts and limits, per alias and over all of them.

What the admin's overview page, ``manage.py alkstore stats`` and the
Prometheus collector read. A queue lives on one alias (``ALKSTORE["DATABASE"]``,
or its ``QUEUES[name]["database"]``), so each alias is asked for its own
queues, and ``every_queue_overview`` joins the answers for the admin and the
metrics, one row per queue.
"""

from __future__ import annotations

from datetime import timedelta

from .conf import app_settings
from .dialects import dialect_for
from .errors import AlkstoreError
from .handlers import registry
from .history import recent_timeouts
from .models import QueueControl
from .presence import live_workers
from .records import QueueLimitState, QueueStats
from .validation import validate_queue_limits


def every_queue_overview() -> list[QueueStats]:
    """Return ``queue_overview`` of every alias alkstore's queues live on, by queue name."""
    rows = [row for alias in app_settings.aliases for row in queue_overview(using=alias)]
    return sorted(rows, key=lambda row: (row.queue, row.database))


def every_queue_limit_state() -> dict[str, QueueLimitState]:
    """Return ``queue_limit_states`` of every alias: each queue's from the alias it lives on."""
    states: dict[str, QueueLimitState] = {}
    for alias in app_settings.aliases:
        for name, state in queue_limit_states(using=alias).items():
            if app_settings.queue_alias(name) == alias:
                states[name] = state
    return states


def queue_overview(*, using: str | None = None) -> list[QueueStats]:
    """Return the counts of every queue of ``using``, by name, from three grouped queries.

    Listed: queues with rows or paused there, and those of ``QUEUES`` and the
    handlers that live there. ``pending``: ready jobs; ``scheduled``: due later;
    ``overdue``: processing past their claim deadline; ``oldest_pending_age_s``:
    the oldest ready job's wait; ``consumers``: live workers running it
    (``unconsumed`` flags jobs nobody runs); ``timed_out``: attempts stopped at
    their time limit in the last hour.
    """
    alias = using or app_settings.database
    sql = dialect_for(alias)
    now = sql.database_now()
    counts = sql.overview(now)
    consumers: dict[str, int] = {}
    for worker in live_workers(alias):
        for name in worker.queues:
            consumers[name] = consumers.get(name, 0) + 1
    timed_out = recent_timeouts(alias)
    paused = sql.paused_queues()
    known = {*app_settings.queues, *registry.queues()}
    names = {*counts, *paused, *(n for n in known if app_settings.queue_alias(n) == alias)}
    result = []
    for name in sorted(names):
        row = counts.get(name, {})
        oldest = row.get("oldest_pending_at")
        result.append(
            QueueStats(
                queue=name,
                pending=row.get("pending", 0),
                scheduled=row.get("scheduled", 0),
                processing=row.get("processing", 0),
                dead=row.get("dead", 0),
                oldest_pending_age_s=(
                    max((now - oldest).total_seconds(), 0.0) if oldest is not None else None
                ),
                overdue=row.get("overdue", 0),
                consumers=consumers.get(name, 0),
                timed_out=timed_out.get(name, 0),
                paused=name in paused,
                database=alias,
            )
        )
    return result


def queue_limit_states(*, using: str | None = None) -> dict[str, QueueLimitState]:
    """Return queue -> its limits (``max_running``, ``max_running_per_key``, ``rate``) and window.

    Queues whose ``QUEUES`` entry has neither limit are left out, and so is a
    bad entry (the system check ``alkstore.E011``/``E012`` names it). A window
    whose period has passed counts as closed, as the next claim sees it.
    """
    limited = {}
    for name, opts in app_settings.queues.items():
        try:
            limits = validate_queue_limits(opts if isinstance(opts, dict) else {})
        except AlkstoreError:
            continue
        if limits is not None:
            limited[name] = (limits, opts.get("rate"))
    if not limited:
        return {}
    alias = using or app_settings.database
    now = dialect_for(alias).database_now()
    rows = (
        QueueControl.objects.using(alias)
        .filter(queue__in=limited, window_at__isnull=False)
        .values_list("queue", "window_at", "window_starts")
    )
    windows = {queue: (window_at, starts) for queue, window_at, starts in rows}
    result = {}
    for name, (limits, rate) in sorted(limited.items()):
        window_at, starts = windows.get(name, (None, 0))
        ends_at = None
        if window_at is not None and limits.rate_period_s is not None:
            ends_at = window_at + timedelta(seconds=limits.rate_period_s)
        open_window = ends_at is not None and now < ends_at
        result[name] = QueueLimitState(
            queue=name,
            max_running=limits.max_running,
            max_running_per_key=limits.max_running_per_key,
            rate=rate,
            rate_starts=limits.rate_starts,
            window_starts=starts if open_window else 0,
            window_ends_at=ends_at if open_window else None,
        )
    return result
