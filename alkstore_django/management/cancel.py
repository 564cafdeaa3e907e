"""``manage.py alkstore cancel --id N``: cancel live jobs, running ones included.

One service call per id (``cancels.cancel_jobs``): a pending job is deleted,
a running one is asked to stop (its worker stops it and it ends cancelled).
Each id gets a line saying which, or that no live job has it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.core.management.base import CommandError

from ..queues.cancels import CancelResult, cancel_jobs
from ..store import Store
from .arguments import add_ids_option

SAID = {
    CancelResult.CANCELLED: "cancelled",
    CancelResult.REQUESTED: "cancel requested (running: its worker stops it)",
    None: "not found (finished, dead-lettered or unknown)",
}


def add_cancel_parser(sub: Any) -> None:
    """Add the ``cancel`` subcommand to the ``alkstore`` command's subparsers ``sub``."""
    cancel = sub.add_parser(
        "cancel", help="Cancel live jobs by id: pending ones at once, running ones stopped."
    )
    add_ids_option(cancel, "The job ids (repeatable).")


def cancel_by_id(command: Any, using: str, ids: Sequence[int] | None) -> None:
    """Cancel each of ``ids`` and print what became of it, one line per id."""
    if not ids:
        raise CommandError("Give the jobs to cancel: --id N [N ...].")
    for job_id, result in cancel_jobs(Store(using), ids).items():
        line = f"job {job_id}: {SAID[result]}"
        command.stdout.write(command.style.SUCCESS(line) if result is not None else line)
