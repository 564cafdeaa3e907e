"""The operator's admin: one module per page, each registering its own.

``base`` (the read-only model admin, permissions, escaping), ``overview``
(per-queue counts and throughput), ``queue_controls`` (pause and resume),
``dead_letters``, ``live_jobs``, ``locks``, ``schedules``, ``workers`` (live
workers), ``workflows`` (the list and each one's graph), ``results`` (kept
job results) and the Tasks results page in ``tasks.admin``. Django's admin
autodiscovery imports this package, which imports each page; no page imports
``django.tasks``, so the admin loads on Django 5.2 too.
"""

from __future__ import annotations

from ..tasks import admin as tasks_admin
from . import (
    dead_letters,
    live_jobs,
    locks,
    overview,
    queue_controls,
    results,
    schedules,
    workers,
    workflows,
)

__all__ = [
    "dead_letters",
    "live_jobs",
    "locks",
    "overview",
    "queue_controls",
    "results",
    "schedules",
    "tasks_admin",
    "workers",
    "workflows",
]
