"""The ``Store`` facade over one database alias, and the lazy default ``store``."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from .asyncs import run_sync
from .conf import app_settings
from .errors import StoreClosed
from .handlers import OUTBOX_PREFIX
from .queues import Queue
from .validation import validate_int, validate_name, validate_queue_options

if TYPE_CHECKING:
    from .dialects import AnyDialect
    from .locks import LockHandle
    from .outbox import Outbox
    from .records import Job, JobResult, Notification, Schedule
    from .records import Workflow as WorkflowRecord
    from .scheduler import Fire
    from .workflows import Workflow as WorkflowBuilder


# What a Store keeps of the settings (its dialect, its queues' handles) is of
# one epoch of them: ``reset_on_setting_changed`` starts the next.
_epoch = 0
# The most queue handles a Store keeps: a site naming queues per customer
# would otherwise grow them without end.
MAX_KEPT_QUEUES = 1024


class Store:
    """Every alkstore operation on one database alias (``ALKSTORE["DATABASE"]`` by default)."""

    def __init__(self, using: str | None = None) -> None:
        self._using = using
        self._closed = False
        self._epoch = -1
        self._dialect: AnyDialect | None = None
        self._queues: dict[str, Queue] = {}

    def __repr__(self) -> str:
        return f"<Store using={self.using!r}{' closed' if self._closed else ''}>"

    @property
    def using(self) -> str:
        return self._using or app_settings.database

    @property
    def dialect(self) -> AnyDialect:
        """The engine's statements for this alias: every service reaches the database here."""
        self._keep_current()
        dialect = self._dialect
        if dialect is None:
            # Imported here: the dialects import the models, and the store must
            # import before the apps are ready.
            from .dialects import dialect_for

            dialect = self._dialect = dialect_for(self.using)
        return dialect

    def _keep_current(self) -> None:
        """Drop what this store keeps of settings that have changed since."""
        if self._epoch != _epoch:
            self._epoch, self._dialect, self._queues = _epoch, None, {}

    def check_open(self) -> None:
        """Raise ``StoreClosed`` once ``close()`` has been called."""
        if self._closed:
            raise StoreClosed(f"Store using {self.using!r} is closed: create a new Store.")

    def close(self) -> None:
        """Close the store: every later operation on it raises ``StoreClosed``."""
        self._closed = True

    # --- queues --------------------------------------------------------------

    def queue(self, name: str, **opts: Any) -> Queue:
        """Return a handle on queue ``name`` with ``opts`` resolved over its derived defaults.

        Raises ``InvalidName``/``ReservedName`` for a bad name and
        ``InvalidArgument`` for an unknown option or a value out of range.

        A handle without ``opts`` is kept and handed out again until the
        settings change: ``store.queue(name).enqueue(...)``, as a view writes
        it, resolves the queue's settings once (about a sixth of an enqueue's
        client CPU when it did so at every call).
        """
        self.check_open()
        self._keep_current()
        # A name that is no string (unhashable, perhaps) is refused below, by name.
        kept = self._queues.get(name) if not opts and isinstance(name, str) else None
        if kept is not None:
            return kept
        validate_name("queue", name)
        checked = validate_queue_options(opts)
        queue = Queue(self.of_queue(name), name, app_settings.queue_defaults(name).overlay(checked))
        if not opts:
            if len(self._queues) >= MAX_KEPT_QUEUES:
                self._queues.clear()
            self._queues[name] = queue
        return queue

    def of_queue(self, name: str) -> Store:
        """Return the store queue ``name``'s jobs live in: this one, unless routed elsewhere.

        ``QUEUES[name]["database"]`` names the alias of a queue's jobs for every
        store (docs/scale.md): its handles, workers and schedules all meet there.
        """
        alias = app_settings.queue_database(name)
        return self if alias is None or alias == self.using else get_store(alias)

    def handler_queue(self, name: str) -> Queue:
        """Return the Queue a handler registered under ``name`` runs on.

        That is ``queue(name)``, or for an outbox handler (registered under its
        reserved backing queue) the outbox's queue with its fixed stamps.
        """
        if name.startswith(OUTBOX_PREFIX):
            return self.outbox(name[len(OUTBOX_PREFIX) :]).queue
        return self.queue(name)

    def get_job(self, job_id: int) -> Job | None:
        """Return the job, live or dead, or None. A pure read."""
        self.check_open()
        validate_int("job id", job_id, minimum=-(2**63), maximum=2**63 - 1)
        from .models import DeadJob, Job

        live = Job.objects.using(self.using).filter(id=job_id).first()
        if live is not None:
            return live.to_record()
        dead = DeadJob.objects.using(self.using).filter(id=job_id).first()
        return dead.to_record() if dead is not None else None

    def cancel_job(self, job_id: int) -> bool:
        """Cancel a live job, running or not; False when there is none (finished, dead, unknown).

        A pending job is deleted at once (as ``Queue.cancel`` does). A running
        one gets a durable request its worker hears of (within a second on
        PostgreSQL, the poll interval elsewhere): its handler sees
        ``current_run().cancel_requested``, is stopped after the queue's
        ``cancel_grace_s`` if it runs on, and the job ends ``cancelled`` with
        no retry and no dead letter. A job that finishes first is left as it
        ended. Raises ``InvalidArgument`` for an id that is not a 64-bit integer.
        """
        from .queues.cancels import cancel_job

        return cancel_job(self, job_id) is not None

    def get_result(self, job_id: int) -> JobResult | None:
        """Return what became of a job kept with ``keep_result_s``; None when unknown or expired.

        A job still live has no result yet (None); ``get_job`` reads it.
        """
        from .results import get_result

        return get_result(self, job_id)

    # --- workflows -------------------------------------------------------------

    def enqueue_workflow(self, workflow: WorkflowBuilder) -> int:
        """Write ``workflow`` and release the steps that wait on nothing; return its id.

        Checked whole before anything is written (``InvalidWorkflow``,
        ``InvalidName``, ``InvalidArgument``, ``PayloadError``). Inside
        ``transaction.atomic()`` it joins the caller's transaction.
        """
        from .workflows.service import enqueue_workflow

        return enqueue_workflow(self, workflow)

    def get_workflow(self, workflow_id: int) -> WorkflowRecord | None:
        """Return the workflow and its steps as they stand, or None. A pure read."""
        from .workflows.service import get_workflow

        return get_workflow(self, workflow_id)

    def list_workflows(self, *, state: str | None = None, limit: int = 100) -> list[WorkflowRecord]:
        """Return the newest workflows, of ``state`` when given (their steps left out)."""
        from .workflows.service import list_workflows

        return list_workflows(self, state=state, limit=limit)

    def cancel_workflow(self, workflow_id: int) -> bool:
        """Cancel what has not finished of the workflow; False when it had already ended."""
        from .workflows.service import cancel_workflow

        return cancel_workflow(self, workflow_id)

    # --- async twins: the sync call on Django's thread-sensitive thread (asyncs.run_sync) ----

    async def aget_job(self, job_id: int) -> Job | None:
        """Return the job, live or dead, or None: ``get_job`` for async code."""
        return await run_sync(self.get_job, job_id)

    async def acancel_job(self, job_id: int) -> bool:
        """Cancel a live job, running or not; False when there is none: ``cancel_job``."""
        return await run_sync(self.cancel_job, job_id)

    async def aget_result(self, job_id: int) -> JobResult | None:
        """Return what became of a job kept with ``keep_result_s``, or None: ``get_result``."""
        return await run_sync(self.get_result, job_id)

    async def aenqueue_workflow(self, workflow: WorkflowBuilder) -> int:
        """Write ``workflow`` and release its first steps; return its id: ``enqueue_workflow``.

        Checked whole before anything is written, as the sync call. It commits
        at once unless an atomic block is open on Django's thread-sensitive
        thread: see ``Queue.aenqueue``.
        """
        return await run_sync(self.enqueue_workflow, workflow)

    async def aget_workflow(self, workflow_id: int) -> WorkflowRecord | None:
        """Return the workflow and its steps as they stand, or None: ``get_workflow``."""
        return await run_sync(self.get_workflow, workflow_id)

    async def alist_workflows(
        self, *, state: str | None = None, limit: int = 100
    ) -> list[WorkflowRecord]:
        """Return the newest workflows, of ``state`` when given: ``list_workflows``."""
        return await run_sync(self.list_workflows, state=state, limit=limit)

    async def acancel_workflow(self, workflow_id: int) -> bool:
        """Cancel what has not finished of the workflow; False if it ended: ``cancel_workflow``."""
        return await run_sync(self.cancel_workflow, workflow_id)

    # --- outbox, locks, schedules ----------------------------------------------

    def outbox(self, name: str) -> Outbox:
        """Return the outbox ``name``, backed by the reserved queue ``__alkstore_outbox:{name}``.

        Validated like a queue name; raises ``InvalidName``/``ReservedName``.
        """
        from .outbox import Outbox

        self.check_open()
        return Outbox(self, name)

    def try_lock(self, name: str, *, ttl_s: float, owner: str | None = None) -> LockHandle | None:
        """Take the lease ``name`` for ``ttl_s`` seconds; None when another owner holds it.

        See ``alkstore_django.locks.try_lock``.
        """
        from . import locks

        return locks.try_lock(self, name, ttl_s=ttl_s, owner=owner)

    def lock(
        self, name: str, *, ttl_s: float, owner: str | None = None
    ) -> AbstractContextManager[LockHandle]:
        """Hold the lease ``name`` for a ``with`` block; raise ``LockNotAcquired`` when taken."""
        from . import locks

        return locks.lock(self, name, ttl_s=ttl_s, owner=owner)

    def schedule(
        self,
        name: str,
        spec: str,
        queue: str,
        payload: Any = None,
        *,
        priority: int | None = None,
        max_attempts: int | None = None,
        expires_s: float | None = None,
        zone: str | None = None,
        misfire: str = "all",
    ) -> Schedule:
        """Register (upsert by name) a schedule and return it as stored.

        ``spec`` is ``@every <n><unit>`` (unit s, m, h or d), ``@cron <5 or 6
        fields>`` or ``@cron @daily`` (and the other shorthands), read in
        ``zone`` (an IANA name; ``settings.TIME_ZONE`` by default).
        ``misfire`` is ``all``, ``latest`` or ``skip``. Anything else raises
        ``InvalidSpec`` before any database access. See
        ``alkstore_django.scheduler.schedule``.
        """
        from . import scheduler

        return scheduler.schedule(
            self,
            name,
            spec,
            queue,
            payload,
            priority=priority,
            max_attempts=max_attempts,
            expires_s=expires_s,
            zone=zone,
            misfire=misfire,
        )

    def fired_for(self, job_id: int | str) -> Fire | None:
        """Return the schedule and boundary a job was fired for; None for an unscheduled job.

        See ``alkstore_django.scheduler.fired_for``.
        """
        from . import scheduler

        return scheduler.fired_for(self, job_id)

    def unschedule(self, name: str) -> bool:
        """Delete the schedule ``name``; False when there is none."""
        from . import scheduler

        return scheduler.unschedule(self, name)

    def run_schedules(self, stop: threading.Event) -> None:
        """Lead the schedules until ``stop`` is set; raise ``LeadershipLost`` when another leads.

        See ``alkstore_django.scheduler.run_schedules``.
        """
        from . import scheduler

        scheduler.run_schedules(self, stop)

    # --- notify / listen -----------------------------------------------------

    def notify(self, channel: str, payload: str = "") -> None:
        """Send ``payload`` on ``channel``; inside a transaction it is delivered on commit."""
        from . import notify

        self.check_open()
        notify.notify(self, channel, payload)

    def listen(self, channels: Sequence[str], timeout_s: float) -> Iterator[Notification]:
        """Yield notifications on ``channels`` until ``timeout_s`` passes with none."""
        from . import notify

        self.check_open()
        return notify.listen(self, channels, timeout_s)


_stores: dict[str, Store] = {}
_stores_lock = threading.Lock()


def get_store(using: str | None = None) -> Store:
    """Return the shared Store for ``using`` (the configured alias by default)."""
    alias = using or app_settings.database
    with _stores_lock:
        if alias not in _stores:
            _stores[alias] = Store(alias)
        return _stores[alias]


class DefaultStore:
    """A proxy to the Store of ``ALKSTORE["DATABASE"]``, resolved on every access."""

    def __getattr__(self, name: str) -> Any:
        return getattr(get_store(), name)

    def __repr__(self) -> str:
        return repr(get_store())


store = DefaultStore()


def reset_on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    """Forget the shared stores and what every store keeps when ALKSTORE or DATABASES change."""
    global _epoch
    if setting in {"ALKSTORE", "DATABASES"}:
        from .dialects import forget_dialects

        app_settings.forget()
        _epoch += 1
        with _stores_lock:
            _stores.clear()
        forget_dialects()


def prepare_connection(*, sender: Any, connection: Any, **kwargs: Any) -> None:
    """Let the engine configure each new connection (SQLite: WAL mode)."""
    from .dialects import prepare_connection as prepare

    prepare(connection)
