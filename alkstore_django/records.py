"""Frozen values returned by the API; they hold no database connection."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, ClassVar, Literal

JobState = Literal["pending", "processing", "dead"]


class OutcomeKind(StrEnum):
    """What a handler run decided (``executor.Outcome.kind``); the text is what is logged."""

    ACK = "ack"
    RETRY = "retry"
    FAIL = "fail"
    SNOOZE = "snooze"
    # Not started (the queue was paused, the worker stopping): the attempt goes back.
    RELEASE = "release"
    # Cancelled while it ran (``Store.cancel_job``): no retry, no dead letter.
    CANCEL = "cancel"


class Settled(StrEnum):
    """What became of a job once its outcome was applied (``executor.settle``).

    The one vocabulary of the worker's log lines (``outcome=acked``), its
    counts, the per-minute throughput counters, ``job_finished``'s ``result``
    and the test helpers' runs. ``lost``: the claim was no longer the
    handle's, so nothing changed.
    """

    ACKED = "acked"
    RETRIED = "retried"
    SNOOZED = "snoozed"
    DEAD = "dead"
    LOST = "lost"
    RELEASED = "released"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class Job:
    """A job as stored: the resolved stamps, never the raw options."""

    id: int
    queue: str
    payload: Any
    priority: int
    run_at: datetime
    attempts: int
    max_attempts: int
    visibility_timeout_s: float
    retry_base_s: float
    expires_at: datetime | None
    state: JobState
    worker_id: str | None
    claim_expires_at: datetime | None
    last_error: str | None
    enqueued_at: datetime
    died_at: datetime | None = None
    # The claim this record was read under: it grows at every claim and never resets.
    generation: int = 0
    # The run time limit of each attempt, in seconds; None means no limit.
    timeout_s: float | None = None
    # How often a handler put the job off without spending an attempt, and may.
    snoozes: int = 0
    max_snoozes: int = 100
    # The job's unique key: no other live job of its queue has it (None: no key).
    unique_key: str | None = None
    # The workflow and step this job runs for (``Workflow``); None for a plain job.
    workflow_id: int | None = None
    step: str | None = None
    # How long what became of the job is kept once it finished; None: not kept.
    keep_result_s: float | None = None
    # The key ``max_running_per_key`` limits (None: not limited) and the job's tags.
    concurrency_key: str | None = None
    tags: tuple[str, ...] = ()
    # When ``Store.cancel_job`` asked its run to stop; None: never asked.
    cancel_requested_at: datetime | None = None
    # The handler's last reported progress (``Store.get_job`` only; a claim leaves it None).
    progress: Progress | None = None
    # The trace context of the enqueue (JSON of the propagator's carrier), when it was traced.
    trace_context: str | None = None
    # Not a field: the payload column as a claim read it, before the codec's
    # decode, set on the records a claim builds (``Dialect.job_from_row``) and
    # None on the others. The process pool sends it to the child, which decodes
    # it itself: the decoded value need not be JSON.
    stored_payload: ClassVar[Any] = None


ResultState = Literal["succeeded", "failed", "cancelled"]
WorkflowState = Literal["running", "succeeded", "failed", "cancelled"]
StepState = Literal["waiting", "pending", "processing", "succeeded", "failed", "cancelled"]


@dataclass(frozen=True)
class JobResult:
    """What became of a job kept with ``keep_result_s`` (``Store.get_result``).

    ``value`` is the handler's return value (JSON) when it succeeded;
    ``error`` the stored error when it failed or why it was cancelled.
    """

    job_id: int
    queue: str
    state: ResultState
    value: Any
    error: str | None
    attempts: int
    finished_at: datetime
    expires_at: datetime
    tags: tuple[str, ...] = ()


@dataclass(frozen=True)
class Progress:
    """How far a running job has got, as its handler last reported it (``Run.progress``).

    ``at`` is when it was written, by the database clock.
    """

    done: int
    total: int | None
    note: str | None
    at: datetime | None

    @classmethod
    def from_stored(cls, stored: Any, at: datetime | None) -> Progress | None:
        """Return the progress a job row stores (its JSON and its time), or None."""
        if not isinstance(stored, dict):
            return None
        return cls(done=stored["done"], total=stored.get("total"), note=stored.get("note"), at=at)


# The stored key of a job without a concurrency_key on a queue with
# ``max_running_per_key``: in ``alk_job_key`` with the keyed jobs, so a keyed
# claim finds the unlimited ones by the same index. Records show None.
UNKEYED = ""


# A job's tags are stored as ",a,b,", so one LIKE finds a tag on every engine.
TAG_SEPARATOR = ","


def join_tags(tags: Sequence[str]) -> str | None:
    """Return the stored form of validated ``tags`` (None for none)."""
    return f",{TAG_SEPARATOR.join(tags)}," if tags else None


def split_tags(stored: str | None) -> tuple[str, ...]:
    """Return the tags of a stored ``",a,b,"`` (none for None)."""
    return tuple(stored.strip(TAG_SEPARATOR).split(TAG_SEPARATOR)) if stored else ()


@dataclass(frozen=True)
class WorkflowStep:
    """One step of a workflow as it stands (``Workflow.steps``).

    ``job_id`` is None until the step is released; ``result`` is its
    handler's return value once it succeeded; ``error`` says why it failed
    or was cancelled.
    """

    name: str
    queue: str
    state: StepState
    after: tuple[str, ...]
    job_id: int | None
    result: Any
    error: str | None
    finished_at: datetime | None
    run_on_upstream_failure: bool = False


@dataclass(frozen=True)
class Workflow:
    """A workflow as it stands (``Store.get_workflow``): its state and its steps by name."""

    id: int
    name: str
    state: WorkflowState
    steps: dict[str, WorkflowStep]
    created_at: datetime
    finished_at: datetime | None
    steps_total: int = 0
    # Steps not yet finished (waiting, pending or processing).
    steps_open: int = 0

    @property
    def steps_done(self) -> int:
        """How many steps have finished (succeeded, failed or cancelled)."""
        return self.steps_total - self.steps_open


@dataclass(frozen=True)
class SweepResult:
    """What ``Queue.sweep_expired`` did: live rows expired, dead letters purged."""

    expired: int
    purged: int


@dataclass(frozen=True)
class QueueStats:
    """A queue's counts; ``oldest_pending_age_s`` is None when nothing is ready."""

    queue: str
    pending: int
    scheduled: int
    processing: int
    dead: int
    oldest_pending_age_s: float | None
    overdue: int = 0
    # Live workers consuming the queue (seen within WORKER_TTL_S).
    consumers: int = 0
    # Attempts stopped at their time limit within the last hour.
    timed_out: int = 0
    # Paused: no worker claims from it until it is resumed.
    paused: bool = False
    # The alias its jobs live on (``QUEUES[name]["database"]``, else ``DATABASE``).
    database: str = "default"

    @property
    def unconsumed(self) -> bool:
        """True when jobs wait and no live worker consumes the queue."""
        return (self.pending > 0 or self.scheduled > 0) and self.consumers == 0


@dataclass(frozen=True)
class QueueLimitState:
    """A limited queue's settings and its rate window now (``QUEUES[name]``, database clock).

    ``rate`` is the setting as written (``'100/m'``); ``window_starts`` the
    claims its open window has made and ``window_ends_at`` when that window
    closes, None when no window is open (the next one opens at the next start).
    """

    queue: str
    max_running: int | None = None
    max_running_per_key: int | None = None
    rate: str | None = None
    rate_starts: int | None = None
    window_starts: int = 0
    window_ends_at: datetime | None = None

    @property
    def rate_exhausted(self) -> bool:
        """True when the open window has made all its starts: claims wait for ``window_ends_at``."""
        return self.rate_starts is not None and self.window_starts >= self.rate_starts


@dataclass(frozen=True)
class Notification:
    """One message received by ``Store.listen``."""

    channel: str
    payload: str


@dataclass(frozen=True)
class Schedule:
    """A registered schedule as stored."""

    name: str
    spec: str
    interval_s: int | None  # @every's interval; None for a cron
    zone: str
    misfire: str
    queue: str
    payload: Any
    priority: int
    max_attempts: int
    visibility_timeout_s: float
    retry_base_s: float
    expires_s: float | None
    enabled: bool
    declared: bool
    next_run_at: datetime
    last_fired_at: datetime | None
    last_error: str | None
    last_error_at: datetime | None
    refused_from: datetime | None  # the oldest boundary held due by a refused fire
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class EnqueueStamps:
    """What one enqueue call stamps on every job it writes, already validated.

    ``delay_s`` (relative to the database clock) wins over ``run_at``; neither
    means now. ``expires_s`` is relative to the same instant. A queue keeps
    the stamps of a plain ``enqueue(payload)`` and reuses them, so the common
    call builds nothing.
    """

    queue: str
    channel: str
    priority: int
    max_attempts: int
    visibility_timeout_s: float
    retry_base_s: float
    max_snoozes: int = 100
    timeout_s: float | None = None
    run_at: datetime | None = None
    delay_s: float | None = None
    expires_s: float | None = None
    # The enqueue span's carrier (``tracing``); None, so NULL, when not traced.
    trace_context: str | None = None

    def stamp_params(self) -> list[Any]:
        """The values of ``STAMP_MARKS`` in ``ENQUEUE_COLUMNS``, in that order."""
        return [
            self.max_attempts,
            self.visibility_timeout_s,
            self.retry_base_s,
            self.timeout_s,
            self.max_snoozes,
            self.trace_context,
        ]
