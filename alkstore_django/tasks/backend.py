"""Django's Tasks framework on alkstore queues (Django 6.0+ only).

``TASKS = {"default": {"BACKEND": "alkstore_django.tasks.AlkstoreBackend"}}``
makes every ``@task`` an alkstore job: ``queue_name`` is the queue,
``priority`` the priority, ``run_after`` the job's ``run_at``; the payload is
the task's import path, its JSON arguments and the backend alias
(``calls.TaskCall``). The result id is the job id, so ``get_result`` follows
a job while it is live, after it died and after it finished
(``results.build_result``).

Nothing else in the app imports this module on Django 5.2, where it cannot be
imported (``django.tasks`` does not exist there).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.core import checks
from django.db import transaction
from django.tasks import Task, TaskResult, TaskResultStatus, task_backends
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued
from django.utils.module_loading import import_string

from ..conf import app_settings
from ..errors import AlkstoreError, DuplicateJob
from ..handlers import registry
from ..models import DeadJob
from ..models import Job as JobRow
from ..models import TaskResult as TaskResultRow
from ..records import Schedule
from ..store import Store, get_store
from ..validation import validate_duration, validate_name
from .calls import AlkstoreTask, TaskCall, json_roundtrip, rebuild_task, unique_task_key
from .results import DEFAULT_RESULT_RETENTION_S, ResultsBackend, build_result
from .runner import task_runner

logger = logging.getLogger("alkstore_django.tasks")

DEFAULT_MAX_ATTEMPTS = 1  # Django's semantics: a raising task is FAILED.
OPTION_NAMES = frozenset({"max_attempts", "result_retention_s", "timeout_s"})
MAX_JOB_ID = 2**63 - 1


class AlkstoreBackend(ResultsBackend):
    """Run Django Tasks as alkstore jobs: leases, crash recovery, retries, dead letters.

    ``OPTIONS``: ``max_attempts`` (default 1: a raising task is FAILED, as in
    Django; more turns on retries with the queue's backoff) and
    ``result_retention_s`` (default 7 days; ``None`` keeps results forever).
    Jobs and results live in ``ALKSTORE["DATABASE"]``. The constructor and
    validation never touch the database.
    """

    task_class = AlkstoreTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    @property
    def store(self) -> Store:
        return get_store()

    @property
    def max_attempts(self) -> int:
        return int(self.options.get("max_attempts", DEFAULT_MAX_ATTEMPTS))

    @property
    def timeout_s(self) -> float | None:
        value = self.options.get("timeout_s")
        return None if value is None else float(value)

    def queue_names(self) -> list[str]:
        """Return the queues this backend's tasks may use (its runners listen on them)."""
        return sorted(self.queues) or ["default"]

    def validate_task(self, task: Task) -> None:
        """Django's checks, plus a per-task ``max_attempts`` and ``timeout_s`` (no database)."""
        super().validate_task(task)
        attempts = getattr(task, "max_attempts", None)
        if attempts is not None and (
            isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1
        ):
            raise InvalidTask(
                f"Invalid max_attempts {attempts!r}: expected a whole number of at least 1."
            )
        unique = getattr(task, "unique", False)
        if not isinstance(unique, bool):
            raise InvalidTask(f"Invalid unique {unique!r}: expected True or False.")
        unique_for_s = getattr(task, "unique_for_s", None)
        if unique_for_s is not None and not unique:
            raise InvalidTask(
                f"Task {task.module_path!r} sets unique_for_s without unique=True: the window "
                "holds a unique key, and the task has none."
            )
        try:
            validate_duration(
                "timeout_s", getattr(task, "timeout_s", None), allow_zero=False, allow_none=True
            )
            validate_duration("unique_for_s", unique_for_s, allow_zero=False, allow_none=True)
        except AlkstoreError as exc:
            raise InvalidTask(str(exc)) from exc

    # --- enqueue -----------------------------------------------------------------

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """Write the task as a job and return its READY result (id = the job id).

        Inside ``transaction.atomic()`` the job joins the caller's transaction.
        Arguments that are not JSON raise ``TypeError`` before anything is written.
        A ``unique`` task whose key is taken writes nothing and returns the
        result of the job holding the key (no ``task_enqueued`` signal).
        """
        self.validate_task(task)
        call = TaskCall(
            path=task.module_path,
            args=json_roundtrip(list(args)),
            kwargs=json_roundtrip(dict(kwargs)),
            backend=self.alias,
            run_after=task.run_after,
        )
        try:
            job_id, enqueued_at = self._write(task, call)
        except DuplicateJob as exc:
            assert exc.job_id is not None
            return self.get_result(exc.job_id)
        result: TaskResult = TaskResult(
            task=task,
            id=str(job_id),
            status=TaskResultStatus.READY,
            enqueued_at=enqueued_at,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=call.args,
            kwargs=call.kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        task_enqueued.send(type(self), task_result=result)
        return result

    def _write(self, task: Task, call: TaskCall) -> tuple[int, Any]:
        """Enqueue the call's job; return its id and ``enqueued_at``. ``DuplicateJob`` if held."""
        store = self.store
        unique: dict[str, Any] = {}
        if getattr(task, "unique", False):
            unique = {
                "unique_key": unique_task_key(call.path, call.args, call.kwargs),
                "unique_for_s": getattr(task, "unique_for_s", None),
                "on_duplicate": "raise",
            }
        # Read back in the same transaction: a fast worker may have run the job already.
        with transaction.atomic(using=store.using):
            job_id = store.queue(task.queue_name).enqueue(
                call.to_payload(),
                run_at=task.run_after,
                priority=task.priority,
                max_attempts=getattr(task, "max_attempts", None) or self.max_attempts,
                timeout_s=getattr(task, "timeout_s", None) or self.timeout_s,
                **unique,
            )
            enqueued_at = (
                JobRow.objects.using(store.using)
                .filter(id=job_id)
                .values_list("enqueued_at", flat=True)
                .get()
            )
        return job_id, enqueued_at

    # --- results -----------------------------------------------------------------

    def get_result(self, result_id: Any) -> TaskResult:
        """Rebuild the result of job ``result_id`` from its live row, dead letter or result.

        Unknown, malformed, or another backend's ids raise ``TaskResultDoesNotExist``.
        """
        job_id = _parse_id(result_id)
        using = self.store.using
        live = JobRow.objects.using(using).filter(id=job_id).first()
        dead = None if live is not None else DeadJob.objects.using(using).filter(id=job_id).first()
        row = TaskResultRow.objects.using(using).filter(id=job_id).first()
        source = live or dead
        if source is not None:
            call = TaskCall.from_payload(source.payload)
        elif row is not None:
            call = TaskCall(row.task_path, row.args, row.kwargs, row.backend, row.run_after)
        else:
            call = None
        if call is None or call.backend != self.alias:
            raise TaskResultDoesNotExist(f"No task result with id {result_id!r}.")
        try:
            task = rebuild_task(call, source or row)
        except (ImportError, ValueError, TypeError, InvalidTask) as exc:
            raise TaskResultDoesNotExist(
                f"Task result {result_id!r} names task {call.path!r}, which cannot be "
                f"rebuilt: {exc}"
            ) from exc
        return build_result(task, job_id, call, live=live, dead=dead, row=row)

    # --- system checks -----------------------------------------------------------

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """Check the backend's OPTIONS and QUEUES without touching the database."""
        messages: list[checks.CheckMessage] = []
        if "alkstore_django" not in settings.INSTALLED_APPS:
            messages.append(
                checks.Error(
                    f"TASKS[{self.alias!r}] uses AlkstoreBackend but 'alkstore_django' is not "
                    "installed.",
                    hint="Add 'alkstore_django' to INSTALLED_APPS and run migrate.",
                    id="alkstore.E101",
                )
            )
        for name in sorted(set(self.options) - OPTION_NAMES):
            messages.append(
                checks.Error(
                    f"Unknown TASKS[{self.alias!r}]['OPTIONS'] key {name!r}.",
                    hint=f"Expected one of {', '.join(sorted(OPTION_NAMES))}.",
                    id="alkstore.E102",
                )
            )
        messages += self._check_option_values()
        for name in self.queue_names():
            try:
                validate_name("queue", name)
            except AlkstoreError as exc:
                messages.append(
                    checks.Error(str(exc), hint="Rename the queue.", id="alkstore.E104")
                )
        return messages

    def _check_option_values(self) -> list[checks.CheckMessage]:
        """Check ``max_attempts`` (E103), ``result_retention_s`` (E105) and ``timeout_s`` (E106)."""
        messages: list[checks.CheckMessage] = []
        attempts = self.options.get("max_attempts", DEFAULT_MAX_ATTEMPTS)
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
            messages.append(
                checks.Error(
                    f"TASKS[{self.alias!r}]['OPTIONS']['max_attempts'] is {attempts!r}.",
                    hint="Use a whole number of at least 1 (1 turns retries off).",
                    id="alkstore.E103",
                )
            )
        retention = self.options.get("result_retention_s", DEFAULT_RESULT_RETENTION_S)
        if retention is not None and (
            isinstance(retention, bool) or not isinstance(retention, int | float) or retention <= 0
        ):
            messages.append(
                checks.Error(
                    f"TASKS[{self.alias!r}]['OPTIONS']['result_retention_s'] is {retention!r}.",
                    hint="Use a positive number of seconds, or None to keep results forever.",
                    id="alkstore.E105",
                )
            )
        try:
            validate_duration(
                "timeout_s", self.options.get("timeout_s"), allow_zero=False, allow_none=True
            )
        except AlkstoreError as exc:
            messages.append(
                checks.Error(
                    f"TASKS[{self.alias!r}]['OPTIONS']['timeout_s']: {exc}",
                    hint="Use a positive number of seconds, or None for no run time limit.",
                    id="alkstore.E106",
                )
            )
        return messages


def _parse_id(result_id: Any) -> int:
    text = str(result_id) if isinstance(result_id, str | int) else ""
    if isinstance(result_id, bool) or not text.isascii() or not text.isdigit():
        raise TaskResultDoesNotExist(f"No task result with id {result_id!r}.")
    job_id = int(text)
    if not 0 < job_id <= MAX_JOB_ID:
        raise TaskResultDoesNotExist(f"No task result with id {result_id!r}.")
    return job_id


def schedule_task(
    name: str,
    task: Task,
    spec: str,
    *,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    zone: str | None = None,
    misfire: str = "all",
) -> Schedule:
    """Register (upsert by name) a schedule that enqueues ``task`` at each boundary.

    The schedule's payload is exactly what ``task.enqueue(*args, **kwargs)``
    writes, on ``task.queue_name`` with its priority and attempts, so each
    fire is an ordinary Tasks job: its result id is the job id and a
    ``takes_context`` task reads its boundary with
    ``store.fired_for(context.task_result.id)``. A schedule carries no
    ``run_after`` and no time limit of its own: the fired job takes the
    queue's ``timeout_s``, so a task whose ``timeout_s`` differs is refused
    here rather than run under another limit.
    """
    backend = task.get_backend()
    if not isinstance(backend, AlkstoreBackend):
        raise InvalidTask(
            f"Task {task.module_path!r} uses backend {task.backend!r}, which is not an "
            "AlkstoreBackend: only alkstore tasks can be scheduled."
        )
    backend.validate_task(task)
    timeout_s = getattr(task, "timeout_s", None) or backend.timeout_s
    queue_timeout_s = app_settings.queue_defaults(task.queue_name).timeout_s
    if timeout_s is not None and timeout_s != queue_timeout_s:
        raise InvalidTask(
            f"Task {task.module_path!r} has timeout_s {timeout_s!r} but queue "
            f"{task.queue_name!r} stamps {queue_timeout_s!r}: a scheduled job takes the "
            f"queue's; set ALKSTORE['QUEUES'][{task.queue_name!r}]['timeout_s']."
        )
    call = TaskCall(
        path=task.module_path,
        args=json_roundtrip(list(args)),
        kwargs=json_roundtrip(dict(kwargs or {})),
        backend=backend.alias,
    )
    return backend.store.schedule(
        name,
        spec,
        task.queue_name,
        call.to_payload(),
        priority=task.priority,
        max_attempts=getattr(task, "max_attempts", None) or backend.max_attempts,
        zone=zone,
        misfire=misfire,
    )


def alkstore_backends() -> list[AlkstoreBackend]:
    """Return every configured Tasks backend that is an ``AlkstoreBackend``."""
    found: list[AlkstoreBackend] = []
    for alias, params in (getattr(settings, "TASKS", {}) or {}).items():
        try:
            backend_class = import_string(params.get("BACKEND", ""))
        except ImportError:
            continue  # Django's own check reports a backend that cannot be imported.
        if isinstance(backend_class, type) and issubclass(backend_class, AlkstoreBackend):
            backend = task_backends[alias]
            if isinstance(backend, AlkstoreBackend):
                found.append(backend)
    return found


def register_task_runners() -> None:
    """Register the task runner on every queue of every ``AlkstoreBackend`` in ``TASKS``.

    Called by ``AppConfig.ready()`` on Django 6; ``runworker`` then runs the
    Tasks queues like any other. A queue that already has another handler
    (an ``@handler`` of the same name) is a conflict: the system check
    ``alkstore.E201`` names it and no worker runs that queue.
    """
    for backend in alkstore_backends():
        for name in backend.queue_names():
            registry.register(name, task_runner)
