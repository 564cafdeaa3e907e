"""What a Tasks job carries: the call (task path, JSON arguments, backend) and the task.

``AlkstoreTask`` and the ``task`` decorator add alkstore's per-task options
(``max_attempts``, ``timeout_s``, uniqueness); ``TaskCall`` is the job's
payload, read and written; ``rebuild_task`` turns a call back into its Task.
Django 6.0+ only, like the rest of ``tasks``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from django.tasks import Task
from django.tasks import task as django_task
from django.tasks.exceptions import InvalidTask
from django.utils.dateparse import parse_datetime
from django.utils.json import normalize_json
from django.utils.module_loading import import_string

from ..validation import encode_payload


@dataclass(frozen=True, slots=True, kw_only=True)
class AlkstoreTask(Task):
    """A Task that may carry its own ``max_attempts``, ``timeout_s`` and uniqueness.

    ``@task(max_attempts=5, timeout_s=30)``; ``None`` means the backend's
    ``OPTIONS`` (1 attempt and no time limit by default). ``unique=True``
    gives each enqueue the unique key of the task and its arguments
    (``unique_task_key``), held ``unique_for_s`` past success when set.
    """

    max_attempts: int | None = None
    timeout_s: float | None = None
    unique: bool = False
    unique_for_s: float | None = None


def unique_task_key(path: str, args: list[Any], kwargs: dict[str, Any]) -> str:
    """Return the unique key of a call: the task's path and a digest of its JSON arguments.

    Equal arguments give equal keys whatever the order of ``kwargs``.
    """
    arguments = json.dumps([args, kwargs], sort_keys=True, separators=(",", ":"))
    return f"task:{path[:120]}:{hashlib.sha256(arguments.encode('utf-8')).hexdigest()}"


def task(
    function: Callable[..., Any] | None = None,
    *,
    max_attempts: int | None = None,
    timeout_s: float | None = None,
    unique: bool = False,
    unique_for_s: float | None = None,
    **options: Any,
) -> Any:
    """Django's ``@task`` that also takes ``max_attempts``, ``timeout_s`` and ``unique``.

    ``django.tasks.task`` hands extra options to the backend's task class only
    from Django 6.1; on 6.0 ``@task(max_attempts=5)`` is a ``TypeError``. This
    decorator builds the task with Django's own and then sets them; the
    backend validates them (``InvalidTask``). Every other option is Django's.
    Either on a backend that is not an ``AlkstoreBackend`` raises
    ``InvalidTask`` naming the backend.
    """
    given = (
        ("max_attempts", max_attempts),
        ("timeout_s", timeout_s),
        ("unique", unique or None),
        ("unique_for_s", unique_for_s),
    )
    ours: dict[str, Any] = {name: value for name, value in given if value is not None}

    def wrapper(func: Callable[..., Any]) -> Task:
        built: Task = django_task(**options)(func)
        if not ours:
            return built
        if not isinstance(built, AlkstoreTask):
            raise InvalidTask(
                f"Task {built.module_path!r} sets {', '.join(ours)}, but TASKS[{built.backend!r}] "
                f"is {type(built.get_backend()).__name__}: expected an AlkstoreBackend."
            )
        return replace(built, **ours)

    return wrapper if function is None else wrapper(function)


@dataclass(frozen=True)
class TaskCall:
    """What a Tasks job's payload says: which task, its arguments, which backend."""

    path: str
    args: list[Any]
    kwargs: dict[str, Any]
    backend: str
    run_after: datetime | None = None

    @classmethod
    def from_payload(cls, payload: Any) -> TaskCall | None:
        """Return the call a payload describes, or None when it is not a Tasks payload."""
        if not isinstance(payload, dict) or not isinstance(payload.get("task"), str):
            return None
        args, kwargs = payload.get("args", []), payload.get("kwargs", {})
        backend = payload.get("backend")
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            return None
        if not isinstance(backend, str):
            return None
        raw = payload.get("run_after")
        run_after = parse_datetime(raw) if isinstance(raw, str) else None
        return cls(payload["task"], args, kwargs, backend, run_after)

    def to_payload(self) -> dict[str, Any]:
        return {
            "task": self.path,
            "args": self.args,
            "kwargs": self.kwargs,
            "backend": self.backend,
            "run_after": None if self.run_after is None else self.run_after.isoformat(),
        }


def json_roundtrip(value: Any) -> Any:
    """Return ``value`` as JSON gives it back; ``TypeError`` when JSON cannot hold it."""
    # normalize_json keeps non-string dict keys; what is stored is what JSON gives back.
    return json.loads(json.dumps(normalize_json(value)))


def json_value(value: Any, max_bytes: int) -> Any:
    """Return ``value`` as JSON gives it back, refused like a payload when it cannot be stored.

    A value JSON cannot hold raises ``TypeError``, as Django's own backends
    do; NaN and infinities, U+0000, lone surrogates and values over
    ``max_bytes`` raise ``PayloadError``: the database would refuse them
    when the result is written.
    """
    return json.loads(encode_payload(normalize_json(value), max_bytes))


def rebuild_task(call: TaskCall, source: Any) -> Task:
    """Return the Task as it was enqueued: the imported task with the stored overrides."""
    found = import_string(call.path)
    if not isinstance(found, Task):
        raise TypeError(f"{call.path!r} is not a Task.")
    return replace(
        found,
        priority=source.priority,
        queue_name=source.queue,
        run_after=call.run_after,
        backend=call.backend,
    )
