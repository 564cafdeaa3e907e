"""alkstore_django: durable background work inside your Django database.

The public surface imports no models, so importing it before Django is set up
(in settings or a ``jobs.py``) is safe. ``store`` is a proxy that resolves the
configured database alias on every access.
"""

from __future__ import annotations

from . import errors
from .errors import Cancelled, Fail, Snooze
from .handlers import handler
from .runs import Run, current_run
from .store import Store, store
from .workflows import Workflow

__all__ = [
    "Cancelled",
    "Fail",
    "Run",
    "Snooze",
    "Store",
    "Workflow",
    "current_run",
    "errors",
    "handler",
    "store",
]
__version__ = "0.1.0"
