"""Helpers for a site's own tests: run the Django Tasks jobs that are ready, in-process."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from django.db import transaction

from .errors import Fail
from .queues import JobHandle
from .store import get_store

logger = logging.getLogger(__name__)

DEFAULT_WORKER_ID = "run_ready_tasks"


def run_ready_tasks(
    using: str | None = None,
    *,
    backend: str | None = None,
    queues: Sequence[str] | None = None,
    worker_id: str = DEFAULT_WORKER_ID,
) -> int:
    """Run every ready Django Tasks job on this thread; return how many attempts ran.

    ``using`` is the database alias (``ALKSTORE["DATABASE"]`` by default);
    ``backend`` narrows the run to one ``TASKS`` alias (every ``AlkstoreBackend``
    by default) and ``queues`` to some queues (the backends' ``QUEUES`` by
    default). Each job is claimed, run and settled exactly as ``runworker``
    would — results, signals, retries — but on the caller's thread and
    connection, so it works inside a test's transaction (``TestCase``,
    ``django_db`` without ``transaction=True``). It returns when no job is
    ready: a retried job waiting for its backoff is left for a later call.
    Requires Django 6.
    """
    from .tasks import alkstore_backends

    store = get_store(using)
    names = (
        list(queues)
        if queues is not None
        else sorted(
            {
                name
                for found in alkstore_backends()
                if backend is None or found.alias == backend
                for name in found.queue_names()
            }
        )
    )
    handles = [store.queue(name) for name in names]
    ran = 0
    while True:
        progressed = False
        for queue in handles:
            handle = queue.claim_one(worker_id)
            if handle is None:
                continue
            progressed = True
            ran += 1
            _run_one(handle, store.using)
        if not progressed:
            return ran


def _run_one(handle: JobHandle, using: str) -> None:
    from .task_runner import task_runner

    job = handle.job
    exc: BaseException | None = None
    kind = "ack"
    try:
        value = task_runner(job, using)
    except KeyboardInterrupt:
        # Whoever pressed Ctrl-C wants the test run to stop; the job did not fail.
        handle.release()
        raise
    except Fail as caught:
        kind, exc, value = "fail", caught, None
    except BaseException as caught:
        kind, exc, value = "retry", caught, None
        logger.error("task raised id=%s attempts=%s", job.id, job.attempts, exc_info=True)
    with transaction.atomic(using=using):
        if kind == "ack":
            if handle.ack():
                task_runner.on_acked(job, value, using)
            return
        error = (str(exc) or "failed") if kind == "fail" else f"{type(exc).__name__}: {exc}"
        exhausted = kind == "fail" or job.attempts >= job.max_attempts
        applied = handle.fail(error) if kind == "fail" else handle.retry(error)
        if applied:
            task_runner.on_failed(job, exc, error, exhausted, using)
