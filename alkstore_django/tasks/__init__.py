"""The backend for Django's Tasks framework (Django 6+).

``backend`` (``AlkstoreBackend``, the ``@task`` decorator with alkstore's
options, ``schedule_task``, ``prune_results``), ``runner`` (the handler that
runs a task's job and records its result) and ``admin`` (the results page).
Set ``TASKS = {"default": {"BACKEND": "alkstore_django.tasks.AlkstoreBackend"}}``.
The names are loaded on first use: ``django.tasks`` exists only on Django 6,
and the admin's results page must import on Django 5.2.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .backend import (
        AlkstoreBackend,
        AlkstoreTask,
        TaskCall,
        TaskLost,
        prune_results,
        schedule_task,
        task,
        unique_task_key,
    )

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
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.backend"), name)
