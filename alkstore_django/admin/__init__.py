"""The operator's admin: one module per page, each registering its own.

``base`` (the read-only model admin, permissions, escaping), ``jobs`` (the
overview, live jobs, dead letters, locks, queue controls), ``schedules``,
``workers`` (live workers) and the Tasks results page in ``tasks.admin``.
Django's admin autodiscovery imports this package, which imports each page.
"""

from __future__ import annotations

from ..tasks import admin as tasks_admin
from . import jobs, schedules, workers

__all__ = ["jobs", "schedules", "tasks_admin", "workers"]
