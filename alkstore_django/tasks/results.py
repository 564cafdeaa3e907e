"""Task results: derived from the job's live row, its dead letter or its result row.

``build_result`` is the one place a ``TaskResult`` is rebuilt (for
``get_result``, ``task_started`` and ``task_finished``); an attempt that ended
without an outcome reads as a ``TaskLost`` error. ``prune_results`` forgets
finished results past their backend's retention. Django 6.0+ only.
"""

from __future__ import annotations

import functools
from datetime import datetime, timedelta
from typing import Any

from django.tasks import Task, TaskResult, TaskResultStatus
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import TaskError

from ..conf import app_settings
from ..models import DeadJob, TaskStatus
from ..models import Job as JobRow
from ..models import TaskResult as TaskResultRow
from ..store import get_store
from .calls import TaskCall

DEFAULT_RESULT_RETENTION_S = 604_800.0
# The documented public path, stored in each TaskLost error: it resolves
# whichever module of ``tasks`` defines the class.
TASK_LOST_PATH = "alkstore_django.tasks.TaskLost"

# (status, finished_at, return value, TaskLost entries to add to the errors)
Outcome = tuple[TaskResultStatus, datetime | None, Any, list[dict[str, Any]]]


class TaskLost(Exception):
    """The attempt ended without an outcome: its worker stopped, or the job was removed."""


class ResultsBackend(BaseTaskBackend):
    """A Tasks backend whose finished results are kept ``result_retention_s`` seconds.

    What the runner needs of ``AlkstoreBackend`` to prune, without importing
    it: the alias and the retention (``OPTIONS["result_retention_s"]``,
    default 7 days; ``None`` keeps results forever).
    """

    @property
    def result_retention_s(self) -> float | None:
        value = self.options.get("result_retention_s", DEFAULT_RESULT_RETENTION_S)
        return None if value is None else float(value)


def lost_error(attempt: int, worker_id: str, why: str) -> dict[str, Any]:
    """Return the stored error of an attempt that ended without an outcome (a ``TaskLost``)."""
    message = f"attempt {attempt} on worker {worker_id!r} ended without an outcome ({why})"
    return {
        "attempt": attempt,
        "exception_class_path": TASK_LOST_PATH,
        "traceback": f"{TASK_LOST_PATH}: {message}\n",
    }


def missing_errors(
    errors: list[dict[str, Any]], attempts: int, worker_ids: list[str], why: str
) -> list[dict[str, Any]]:
    """Return a TaskLost entry for every attempt up to ``attempts`` that has no error."""
    seen = {e.get("attempt") for e in errors}
    return [
        lost_error(n, worker_ids[n - 1] if n <= len(worker_ids) else "unknown", why)
        for n in range(1, attempts + 1)
        if n not in seen
    ]


def build_result(
    task: Task,
    job_id: int,
    call: TaskCall,
    *,
    live: JobRow | None = None,
    dead: DeadJob | None = None,
    row: TaskResultRow | None = None,
    running: bool = False,
) -> TaskResult:
    """Derive a TaskResult: a live job says READY/RUNNING, else the result, else the dead letter."""
    errors = list(row.errors) if row is not None else []
    worker_ids = list(row.worker_ids) if row is not None else []
    enqueued_at = (live or dead or row).enqueued_at  # type: ignore[union-attr]
    status, finished_at, value, lost = _outcome(live, dead, row, errors, worker_ids, running)
    result: TaskResult = TaskResult(
        task=task,
        id=str(job_id),
        status=status,
        enqueued_at=enqueued_at,
        started_at=row.started_at if row is not None else None,
        finished_at=finished_at,
        last_attempted_at=row.last_attempted_at if row is not None else None,
        args=call.args,
        kwargs=call.kwargs,
        backend=call.backend,
        errors=_errors(errors + lost),
        worker_ids=worker_ids,
    )
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", value)
    return result


def _outcome(
    live: JobRow | None,
    dead: DeadJob | None,
    row: TaskResultRow | None,
    errors: list[dict[str, Any]],
    worker_ids: list[str],
    running: bool,
) -> Outcome:
    """Return what the rows say of the task: the first of running, live, finished, dead."""
    if running:
        # The view of an attempt being started, for its context and task_started.
        return TaskResultStatus.RUNNING, None, None, []
    if live is not None:
        return _live_outcome(live, errors, worker_ids)
    if row is not None and row.status in {TaskStatus.SUCCESSFUL, TaskStatus.FAILED}:
        return TaskResultStatus(row.status), row.finished_at, row.return_value, []
    if dead is not None:
        why = f"the job was dead-lettered: {dead.last_error!r}"
        return (
            TaskResultStatus.FAILED,
            dead.died_at,
            None,
            missing_errors(errors, dead.attempts, worker_ids, why),
        )
    # The job was cancelled, or its dead letter purged, before it reported an outcome.
    finished_at = row.last_attempted_at if row is not None else None
    attempts = max(len(worker_ids), 1)
    lost = missing_errors(errors, attempts, worker_ids, "the job was removed")
    return TaskResultStatus.FAILED, finished_at, None, lost


def _live_outcome(live: JobRow, errors: list[dict[str, Any]], worker_ids: list[str]) -> Outcome:
    status = TaskResultStatus.RUNNING if live.state == "processing" else TaskResultStatus.READY
    lapsed = live.claim_expires_at is not None and live.claim_expires_at <= _db_now(live)
    if status != TaskResultStatus.RUNNING or not lapsed:
        return status, None, None, []
    # Its worker is gone: the next claim re-runs it, or dead-letters it when exhausted.
    if live.attempts < live.max_attempts:
        return TaskResultStatus.READY, None, None, []
    lost = missing_errors(errors, live.attempts, worker_ids, "its claim lapsed")
    return TaskResultStatus.FAILED, live.claim_expires_at, None, lost


def _errors(entries: list[dict[str, Any]]) -> list[TaskError]:
    ordered = sorted(entries, key=lambda e: e.get("attempt", 0))
    return [
        TaskError(exception_class_path=e["exception_class_path"], traceback=e["traceback"])
        for e in ordered
    ]


def _db_now(row: Any) -> datetime:
    return get_store(row._state.db).dialect.database_now()


def prune_results(backend: ResultsBackend, using: str | None = None) -> int:
    """Delete ``backend``'s finished results older than its retention, in batches; return how many.

    Oldest first on ``alk_taskres_retention``, ``PRUNE_BATCH_SIZE`` rows a
    statement, each its own short transaction (``Dialect.in_batches``).
    """
    retention = backend.result_retention_s
    if retention is None:
        return 0
    dialect = get_store(using or app_settings.database).dialect
    cutoff = dialect.database_now() - timedelta(seconds=retention)
    return dialect.in_batches(functools.partial(dialect.prune_task_results, backend.alias, cutoff))
