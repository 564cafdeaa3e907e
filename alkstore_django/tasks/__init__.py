"""The backend for Django's Tasks framework (Django 6+).

``backend`` (``AlkstoreBackend``, ``schedule_task``), ``calls`` (the job's
payload ``TaskCall``, ``AlkstoreTask`` and the ``@task`` decorator with
alkstore's options), ``results`` (``TaskResult`` rebuilt from the rows,
``TaskLost``, ``prune_results``), ``runner`` (the handler that runs a task's
job and records its result) and ``admin`` (the results page). Imports point
one way: backend → runner → results → calls.
Set ``TASKS = {"default": {"BACKEND": "alkstore_django.tasks.AlkstoreBackend"}}``.
The names are loaded on first use: ``django.tasks`` exists only on Django 6,
and the admin's results page must import on Django 5.2.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .backend import AlkstoreBackend, schedule_task
    from .calls import AlkstoreTask, TaskCall, task, unique_task_key
    from .results import TaskLost, prune_results

# Each public name, and the submodule that defines it.
_EXPORTS = {
    "AlkstoreBackend": "backend",
    "AlkstoreTask": "calls",
    "TaskCall": "calls",
    "TaskLost": "results",
    "prune_results": "results",
    "schedule_task": "backend",
    "task": "calls",
    "unique_task_key": "calls",
}

__all__ = [
    "AlkstoreBackend",
    "AlkstoreTask",
    "TaskCall",
    "TaskLost",
    "prune_results",
    "schedule_task",
    "task",
    "unique_task_key",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)
