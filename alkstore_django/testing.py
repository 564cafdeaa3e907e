"""Helpers for a site's own tests: run the ready jobs in-process, on the caller's connection.

``runworker`` cannot run inside a ``TestCase`` (its threads use connections of
their own, which cannot see the test's uncommitted rows; on SQLite they wait on
its write lock). These helpers claim, run and settle each ready job on the
calling thread, with the outcome applied exactly as the worker applies it
(``executor.run_handler`` and ``executor.settle``): retries with backoff, dead
letters, the Tasks backend's results and signals.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .errors import InvalidArgument
from .executor import Outcome, OutcomeKind, Settled, has_hooks, run_handler, settle
from .handlers import outbox_queue_name, registry
from .store import get_store

DEFAULT_WORKER_ID = "run_ready_jobs"


@dataclass(frozen=True)
class JobRun:
    """One attempt a test helper ran: the job, the attempt, and what became of it.

    ``outcome`` is ``acked``, ``retried``, ``dead``, ``cancelled`` or ``lost``;
    ``error`` the text stored for a failed attempt; ``value`` what the handler
    returned.
    """

    job_id: int
    queue: str
    attempt: int
    outcome: Settled
    error: str | None = None
    value: Any = None


def run_ready_jobs(
    queues: Sequence[str] | None = None,
    *,
    outboxes: Sequence[str] = (),
    using: str | None = None,
    worker_id: str = DEFAULT_WORKER_ID,
) -> list[JobRun]:
    """Run every ready job of ``queues`` and ``outboxes`` on this thread; return the runs.

    With neither given, every registered handler's queue is run (queues,
    outboxes and the Tasks backends' queues alike). Each job is run with its
    queue's registered handler, so it works inside a test's transaction
    (``TestCase``, ``django_db`` without ``transaction=True``). It returns when
    no job is ready: a retried job waiting for its backoff is left for a later
    call (make it due with your own helper, or use ``retry_base_s=0``).
    Raises ``InvalidArgument`` for a queue without a handler.
    """
    names = [*(queues or ()), *(outbox_queue_name(name) for name in outboxes)]
    if not names:
        names = registry.queues()
    store = get_store(using)
    handled = []
    for name in names:
        func: Any = registry.get(name)
        if func is None:
            known = ", ".join(map(repr, registry.queues())) or "none"
            raise InvalidArgument(
                f"No handler registered for queue {name!r}: expected one of {known}."
            )
        # The Tasks runner writes its results to the database it is told.
        queue = store.handler_queue(name)
        call = functools.partial(func, using=queue.store.using) if has_hooks(func) else func
        handled.append((queue, func, call))
    runs: list[JobRun] = []
    while True:
        progressed = False
        for queue, func, call in handled:
            handle = queue.claim_one(worker_id)
            if handle is None:
                continue
            progressed = True
            job = handle.job
            # The queue's own alias: a queue routed to another database settles there.
            using = queue.store.using
            try:
                outcome = run_handler(call, job, job)
            except KeyboardInterrupt:
                settle(handle, Outcome(OutcomeKind.RELEASE), func, using)
                raise
            result = settle(handle, outcome, func, using)
            runs.append(
                JobRun(job.id, job.queue, job.attempts, result, outcome.error, outcome.value)
            )
        if not progressed:
            return runs


def run_ready_tasks(
    using: str | None = None,
    *,
    backend: str | None = None,
    queues: Sequence[str] | None = None,
    worker_id: str = "run_ready_tasks",
) -> int:
    """Run every ready Django Tasks job on this thread; return how many attempts ran.

    ``backend`` narrows the run to one ``TASKS`` alias (every
    ``AlkstoreBackend`` by default) and ``queues`` to some queues (the
    backends' ``QUEUES`` by default). Results, signals and retries are as
    ``runworker`` makes them. Requires Django 6. A backend configured after
    start-up (``override_settings(TASKS=...)``, as Django's own Tasks tests
    do) gets its queues' runner here: ``AppConfig.ready()`` saw only the
    backends of the start-up settings.
    """
    from .tasks.backend import alkstore_backends, register_task_runners

    register_task_runners()
    if queues is None:
        queues = sorted(
            {
                name
                for found in alkstore_backends()
                if backend is None or found.alias == backend
                for name in found.queue_names()
            }
        )
    return len(run_ready_jobs(list(queues), using=using, worker_id=worker_id))
