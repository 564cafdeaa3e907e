"""The handler that runs Django Tasks jobs in the worker and writes their results.

Registered on every Tasks queue by the backend (``register_task_runners``);
it imports the calls and the results, never the backend. Django 6.0+ only.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.tasks import TaskContext, TaskResult, task_backends
from django.tasks.exceptions import InvalidTask, InvalidTaskBackend
from django.tasks.signals import task_finished, task_started

from ..conf import app_settings
from ..errors import Fail, PayloadError
from ..executor import Outcome
from ..models import TaskResult as TaskResultRow
from ..models import TaskStatus
from ..records import Job
from ..signals import send_robust
from ..store import get_store
from .calls import TaskCall, json_value, rebuild_task
from .results import (
    ResultsBackend,
    build_result,
    lost_error,
    missing_errors,
    prune_results,
)

logger = logging.getLogger("alkstore_django.task_runner")

# Each backend's expired results are pruned at most this often, after a task finishes.
PRUNE_INTERVAL_S = 60.0


def _claimed_at(job: Job) -> datetime:
    """Return when this attempt's claim was taken, on the database clock."""
    if job.claim_expires_at is None:
        return job.enqueued_at
    return job.claim_expires_at - timedelta(seconds=job.visibility_timeout_s)


class TaskRunner:
    """The handler registered on every Tasks queue: runs the task, writes its result.

    ``__call__`` runs on a worker thread; ``on_acked``/``on_failed`` run in the
    transaction that applies the outcome, only when it took effect, so a result
    is never lost or written twice. ``task_finished`` is sent from there.
    """

    def __init__(self) -> None:
        self._last_prune: dict[str, float] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"{__name__}.task_runner"

    def __call__(self, job: Job, using: str | None = None) -> Any:
        """Run the task of ``job`` (the attempt it was claimed at); return its JSON value."""
        call = TaskCall.from_payload(job.payload)
        if call is None:
            raise Fail(f"Job {job.id} on queue {job.queue!r} is not a Django Tasks job.")
        backend = _backend(call, job)
        task = rebuild_task(call, job)
        row = self._record_start(job, call, using or app_settings.database)
        result = build_result(task, job.id, call, row=row, running=True)
        send_robust(task_started, type(backend), task_result=result)
        if task.takes_context:
            raw = task.call(TaskContext(task_result=result), *call.args, **call.kwargs)
        else:
            raw = task.call(*call.args, **call.kwargs)
        try:
            return json_value(raw, app_settings.max_payload_bytes)
        except PayloadError as exc:
            # Retrying cannot change what the task returns: FAILED at once, with why.
            raise Fail(f"Task {call.path} returned a value that cannot be stored: {exc}") from exc

    def _record_start(self, job: Job, call: TaskCall, using: str) -> TaskResultRow:
        claimed_at = _claimed_at(job)
        attempt = max(job.attempts, 1)
        fresh = {
            "backend": call.backend,
            "queue": job.queue,
            "task_path": call.path,
            "args": call.args,
            "kwargs": call.kwargs,
            "priority": job.priority,
            "run_after": call.run_after,
            "status": TaskStatus.RUNNING,
            "return_value": None,
            "errors": [],
            "worker_ids": [],
            "enqueued_at": job.enqueued_at,
            "started_at": claimed_at,
            "last_attempted_at": claimed_at,
            "finished_at": None,
        }
        rows = TaskResultRow.objects.using(using)
        with transaction.atomic(using=using):
            # Write first: on SQLite a transaction that reads before it writes can fail busy.
            try:
                with transaction.atomic(using=using):
                    rows.create(id=job.id, **fresh)
            except IntegrityError:
                pass
            row = rows.select_for_update().get(id=job.id)
            changes: dict[str, Any]
            if row.status == TaskStatus.SUCCESSFUL or (attempt == 1 and not row.errors):
                # A first attempt starts a fresh record.
                changes = dict(fresh)
            else:
                changes = {"status": TaskStatus.RUNNING, "last_attempted_at": claimed_at}
                changes["finished_at"] = None
                earlier, worker_ids = list(row.errors), list(row.worker_ids)
                if attempt == 1:
                    # A requeued dead letter counts its attempts from 1 again: its
                    # earlier runs' errors are kept, numbered 0 and below, before this run's.
                    earlier, worker_ids = _renumbered_before_this_run(earlier), []
                changes["errors"] = earlier + missing_errors(
                    earlier, attempt - 1, worker_ids, "its claim lapsed"
                )
                changes["worker_ids"] = worker_ids
            ids: list[str] = changes["worker_ids"]
            ids += ["unknown"] * (attempt - len(ids))
            ids[attempt - 1] = job.worker_id or "unknown"
            del ids[attempt:]
            rows.filter(id=job.id).update(**changes)
            for name, value in changes.items():
                setattr(row, name, value)
        return row

    def on_acked(self, job: Job, value: Any, using: str | None = None) -> None:
        """Record SUCCESSFUL with the return value, in the ack's transaction."""
        self._settle(job, using, TaskStatus.SUCCESSFUL, value=value)

    def on_failed(
        self, job: Job, outcome: Outcome, exhausted: bool, using: str | None = None
    ) -> None:
        """Record the attempt's error; FAILED when no attempt is left."""
        if outcome.exc_class is not None:
            entry = {
                "attempt": job.attempts,
                "exception_class_path": outcome.exc_class,
                "traceback": outcome.traceback or outcome.error or "",
            }
        else:
            entry = lost_error(job.attempts, job.worker_id or "unknown", outcome.error or "failed")
        status = TaskStatus.FAILED if exhausted else TaskStatus.READY
        if exhausted and outcome.exc is None and outcome.traceback:
            # The attempt ran in a child process: its exception did not cross, so
            # Django's task_finished line cannot carry it (the executor left it to that line).
            logger.error("task failed id=%s queue=%s\n%s", job.id, job.queue, outcome.traceback)
        self._settle(job, using, status, error=entry, exc=outcome.exc)

    def _settle(
        self,
        job: Job,
        using: str | None,
        status: str,
        *,
        value: Any = None,
        error: dict[str, Any] | None = None,
        exc: BaseException | None = None,
    ) -> None:
        using = using or app_settings.database
        call = TaskCall.from_payload(job.payload)
        if call is None:
            return
        rows = TaskResultRow.objects.using(using)
        row = rows.select_for_update().filter(id=job.id).first()
        if row is None:
            # The attempt failed before its start was recorded (say, the database blinked).
            row = self._record_start(job, call, using)
        finished = status in {TaskStatus.SUCCESSFUL, TaskStatus.FAILED}
        changes: dict[str, Any] = {"status": status}
        if error is not None:
            changes["errors"] = [e for e in row.errors if e.get("attempt") != job.attempts]
            changes["errors"].append(error)
        if finished:
            now = get_store(using).dialect.database_now()
            changes["finished_at"] = max(now, row.last_attempted_at or now)
            changes["return_value"] = value
        rows.filter(id=job.id).update(**changes)
        for name, new in changes.items():
            setattr(row, name, new)
        if finished:
            try:
                backend = task_backends[call.backend]
            except InvalidTaskBackend:
                return  # dead-lettered for naming an alias that is gone: no one to signal
            if isinstance(backend, ResultsBackend):
                self._prune(backend, using)
            try:
                task = rebuild_task(call, job)
            except (ImportError, ValueError, TypeError, InvalidTask):
                logger.warning("task_finished not sent id=%s: task %s", job.id, call.path)
                return
            result = build_result(task, job.id, call, row=row)
            _send_finished(type(backend), result, exc)

    def _prune(self, backend: ResultsBackend, using: str) -> None:
        retention = backend.result_retention_s
        if retention is None:
            return
        with self._lock:
            key = f"{using}:{backend.alias}"
            if time.monotonic() - self._last_prune.get(key, float("-inf")) < PRUNE_INTERVAL_S:
                return
            self._last_prune[key] = time.monotonic()
        prune_results(backend, using=using)


def _renumbered_before_this_run(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Return ``errors`` shifted so the last earlier attempt is 0 (order kept, no clash)."""
    last = max((int(e.get("attempt", 0)) for e in errors), default=0)
    shift = max(last, 0)
    return [{**e, "attempt": int(e.get("attempt", 0)) - shift} for e in errors]


def _backend(call: TaskCall, job: Job) -> Any:
    """Return the backend a job names; a ``TASKS`` alias that is gone dead-letters the job."""
    try:
        return task_backends[call.backend]
    except InvalidTaskBackend as exc:
        configured = ", ".join(map(repr, getattr(settings, "TASKS", {}) or {})) or "none"
        raise Fail(
            f"Job {job.id} names TASKS alias {call.backend!r}, which is not configured: "
            f"expected one of {configured}."
        ) from exc


def _send_finished(sender: type, result: TaskResult, exc: BaseException | None) -> None:
    """Send ``task_finished``; a failure is sent inside its ``except`` so receivers see exc_info."""
    if exc is None:
        send_robust(task_finished, sender, task_result=result)
        return
    try:
        raise exc
    except BaseException:  # noqa: BLE001 - re-raised only to set exc_info for the receivers
        send_robust(task_finished, sender, task_result=result)


task_runner = TaskRunner()
