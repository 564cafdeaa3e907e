"""A typed, lazy view of ``settings.ALKSTORE`` and the engine defaults.

Settings are read at access time, never at import, so ``override_settings``
works in tests and a site can import the package before settings are ready.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields, replace
from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string

DEFAULT_DATABASE = "default"
DEFAULT_POLL_INTERVAL_S = 5.0
DEFAULT_MAX_PAYLOAD_BYTES = 1_048_576
DEFAULT_SWEEP_INTERVAL_S = 60.0
DEFAULT_PAYLOAD_CODEC = "alkstore_django.codecs.JSONCodec"
# A worker announces itself every third of this; silent longer, it is gone.
DEFAULT_WORKER_TTL_S = 30.0
DEFAULT_WORKFLOW_RETENTION_S = 604_800.0
# Retention (docs/scale.md#retention-every-table-bounded): a prune deletes at
# most PRUNE_BATCH_SIZE rows per statement, each batch its own transaction.
DEFAULT_PRUNE_BATCH_SIZE = 5_000
DEFAULT_THROUGHPUT_RETENTION_S = 86_400.0
DEFAULT_SCHEDULE_FIRE_RETENTION_S = 2_592_000.0
# The SQLite file watch: how often a worker asks PRAGMA data_version.
DEFAULT_SQLITE_WATCH_INTERVAL_S = 0.005
# After a queue's wake-up commits, one process sends no other for that queue
# this long (PostgreSQL): every commit that notifies takes the server's one
# notification lock, which serialized concurrent enqueuers. Workers claim again
# this long (and twice this long) after each wake-up they hear, so no job
# waits on the saving.
DEFAULT_NOTIFY_COALESCE_S = 0.005
MAX_NOTIFY_COALESCE_S = 1.0
# An idle worker claims again one and two windows after each wake-up it hears
# and after it starts to wait; a wake-up covers the enqueues that commit
# within the last of those windows (dialects/postgresql/wakeups.py).
COALESCE_RECHECKS = 2


@dataclass(frozen=True)
class QueueOptions:
    """The stamps a queue handle writes on every job it enqueues."""

    visibility_timeout_s: float = 300
    max_attempts: int = 3
    retry_base_s: float = 5
    priority: int = 0
    expires_s: float | None = None
    dead_letter_retention_s: float | None = 604_800
    # The run time limit of each attempt; None means none (see workers.md).
    timeout_s: float | None = None
    # How often a job may be snoozed before it is dead-lettered (see queues.md).
    max_snoozes: int = 100
    # How long what became of each job is kept once it finished; None: not kept.
    keep_result_s: float | None = None
    # How long a handler asked to cancel may run on before it is stopped.
    cancel_grace_s: float = 10.0
    # The dotted path of ``(attempt, error) -> seconds``; None: the equal-jitter curve.
    backoff: str | None = None

    def overlay(self, opts: dict[str, Any]) -> QueueOptions:
        """Return these options with ``opts`` laid over them (already validated)."""
        return replace(self, **opts)


@dataclass(frozen=True)
class QueueLimits:
    """A queue's claim-time limits, shared by every worker (``QUEUES[name]`` keys)."""

    # At most this many of the queue's jobs under a live claim at once.
    max_running: int | None = None
    # At most ``rate_starts`` claims per window of ``rate_period_s`` seconds.
    rate_starts: int | None = None
    rate_period_s: int | None = None
    # At most this many jobs of one ``concurrency_key`` under a live claim at once.
    max_running_per_key: int | None = None


ENGINE_DEFAULTS = QueueOptions()
QUEUE_OPTION_NAMES = frozenset(f.name for f in fields(QueueOptions))
# Settings only, never a queue handle's option: a limit binds every worker at
# once, so it cannot differ from one handle to the next.
QUEUE_LIMIT_NAMES = frozenset({"max_running", "rate", "max_running_per_key"})
# Where a queue's jobs live: a ``DATABASES`` alias other than ``DATABASE``
# (docs/scale.md). Settings only, like the limits: every handle of the queue,
# every worker and the scheduler must find its jobs in one place.
QUEUE_DATABASE_KEY = "database"
QUEUE_SETTING_NAMES = QUEUE_LIMIT_NAMES | {QUEUE_DATABASE_KEY}
SETTING_KEYS = frozenset(
    {
        "DATABASE",
        "LISTEN_DATABASE",
        "QUEUES",
        "POLL_INTERVAL_S",
        "MAX_PAYLOAD_BYTES",
        "SWEEP_INTERVAL_S",
        "SCHEDULES",
        "WORKER_TTL_S",
        "METRICS_TOKEN",
        "PAYLOAD_CODEC",
        "WORKFLOW_RETENTION_S",
        "PRUNE_BATCH_SIZE",
        "THROUGHPUT_RETENTION_S",
        "SCHEDULE_FIRE_RETENTION_S",
        "NOTIFY_COALESCE_S",
    }
)


class AlkstoreSettings:
    """Read ``settings.ALKSTORE`` key by key, each time it is asked.

    The dict itself is looked up once, until ``forget`` (a ``setting_changed``
    for it: ``override_settings``, pytest-django's ``settings``): an enqueue
    reads four keys, and each lookup through Django's lazy settings object
    cost about a microsecond. A key changed in the dict is still read anew.
    """

    def __init__(self) -> None:
        self._raw: dict[str, Any] | None = None

    @property
    def raw(self) -> dict[str, Any]:
        raw = self._raw
        if raw is None:
            value = getattr(settings, "ALKSTORE", None)
            raw = self._raw = value if isinstance(value, dict) else {}
        return raw

    def forget(self) -> None:
        """Look ``settings.ALKSTORE`` up again at the next read."""
        self._raw = None

    @property
    def database(self) -> str:
        return self.raw.get("DATABASE", DEFAULT_DATABASE)

    @property
    def listen_database(self) -> str:
        """The alias the worker LISTENs on: a direct connection past any pooler."""
        return self.raw.get("LISTEN_DATABASE") or self.database

    def listen_alias(self, using: str) -> str:
        """The alias a watcher of ``using``'s queues LISTENs on.

        ``LISTEN_DATABASE`` is ``DATABASE``'s direct connection; a queue routed
        to another alias is watched on that alias itself (docs/scale.md).
        """
        return self.listen_database if using == self.database else using

    @property
    def queues(self) -> dict[str, dict[str, Any]]:
        return self.raw.get("QUEUES", {}) or {}

    @property
    def poll_interval_s(self) -> float:
        return float(self.raw.get("POLL_INTERVAL_S", DEFAULT_POLL_INTERVAL_S))

    @property
    def max_payload_bytes(self) -> int:
        return int(self.raw.get("MAX_PAYLOAD_BYTES", DEFAULT_MAX_PAYLOAD_BYTES))

    @property
    def sweep_interval_s(self) -> float:
        return float(self.raw.get("SWEEP_INTERVAL_S", DEFAULT_SWEEP_INTERVAL_S))

    @property
    def worker_ttl_s(self) -> float:
        return float(self.raw.get("WORKER_TTL_S", DEFAULT_WORKER_TTL_S))

    @property
    def payload_codec(self) -> Any:
        """The payload codec (``codecs.py``): ``PAYLOAD_CODEC``'s class or instance."""
        return load_codec(self.raw.get("PAYLOAD_CODEC") or DEFAULT_PAYLOAD_CODEC)

    @property
    def metrics_token(self) -> str | None:
        """The bearer token that may read ``metrics_view`` without a staff login."""
        return self.raw.get("METRICS_TOKEN") or None

    @property
    def workflow_retention_s(self) -> float:
        """How long a finished workflow (with its steps' results) is kept."""
        return float(self.raw.get("WORKFLOW_RETENTION_S", DEFAULT_WORKFLOW_RETENTION_S))

    @property
    def prune_batch_size(self) -> int:
        """The most rows one prune statement deletes (each batch is its own transaction)."""
        return int(self.raw.get("PRUNE_BATCH_SIZE", DEFAULT_PRUNE_BATCH_SIZE))

    @property
    def throughput_retention_s(self) -> float:
        """How long the per-minute throughput counters are kept (the chart reads a day)."""
        return float(self.raw.get("THROUGHPUT_RETENTION_S", DEFAULT_THROUGHPUT_RETENTION_S))

    @property
    def schedule_fire_retention_s(self) -> float:
        """How long the boundary a scheduled job was fired for stays readable (``fired_for``)."""
        return float(self.raw.get("SCHEDULE_FIRE_RETENTION_S", DEFAULT_SCHEDULE_FIRE_RETENTION_S))

    @property
    def notify_coalesce_s(self) -> float:
        """How long after a committed wake-up a process sends no other for the queue."""
        return float(self.raw.get("NOTIFY_COALESCE_S", DEFAULT_NOTIFY_COALESCE_S))

    @property
    def schedules(self) -> dict[str, dict[str, Any]]:
        return self.raw.get("SCHEDULES", {}) or {}

    def queue_defaults(self, name: str) -> QueueOptions:
        """Return the queue's derived defaults: engine defaults overlaid by QUEUES[name]."""
        opts = self.queues.get(name, {})
        if not QUEUE_SETTING_NAMES.isdisjoint(opts):
            opts = {k: v for k, v in opts.items() if k not in QUEUE_SETTING_NAMES}
        return ENGINE_DEFAULTS.overlay(opts)

    def queue_database(self, name: str) -> str | None:
        """Return the alias ``QUEUES[name]["database"]`` routes the queue to, None if unrouted."""
        opts = self.queues.get(name)
        return opts.get(QUEUE_DATABASE_KEY) if isinstance(opts, dict) else None

    def queue_alias(self, name: str) -> str:
        """Return the alias queue ``name``'s jobs live on: its ``database``, else ``DATABASE``."""
        return self.queue_database(name) or self.database

    @property
    def aliases(self) -> list[str]:
        """Every alias that holds alkstore's tables: ``DATABASE`` first, then the queues' own."""
        found = [self.database]
        for opts in self.queues.values():
            alias = opts.get(QUEUE_DATABASE_KEY) if isinstance(opts, dict) else None
            if alias and alias not in found:
                found.append(alias)
        return found


@functools.cache
def load_codec(path: str) -> Any:
    """Import the codec at ``path`` once; a class is instantiated."""
    found = import_string(path)
    return found() if isinstance(found, type) else found


app_settings = AlkstoreSettings()
