"""``manage.py alkstore requeue`` and ``retry``: dead letters back to work, retries due now.

The repairs of the ``alkstore`` command, apart from its listings: each
selects by ``--queue``, ``--tag`` or ``--id``, checks an id selection all or
nothing, calls one service of ``operations`` and says what it changed.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

from django.core.management.base import CommandError

from .. import operations
from ..errors import InvalidArgument
from ..validation import validate_tag
from .arguments import add_ids_option

# How many unknown ids an error names before "and N more".
MISSING_SHOWN = 10


def listed(ids: Sequence[int]) -> str:
    """Return the first ``MISSING_SHOWN`` of ``ids``, comma-separated, and how many more."""
    more = len(ids) - MISSING_SHOWN
    return ", ".join(map(str, ids[:MISSING_SHOWN])) + (f" and {more} more" if more > 0 else "")


def tag_argument(value: str) -> str:
    """Parse ``--tag``: a bad tag is a usage error naming it, before anything is read."""
    try:
        return validate_tag(value)
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_repair_parsers(sub: Any) -> None:
    """Add the ``requeue`` and ``retry`` subcommands to the ``alkstore`` command's ``sub``."""
    requeue = sub.add_parser(
        "requeue", help="Requeue a queue's dead letters, those with a tag, or some ids."
    )
    requeue.add_argument("--queue", default=None, help="The queue whose dead letters to move.")
    requeue.add_argument(
        "--tag", type=tag_argument, default=None, help="Only the dead letters with this tag."
    )
    add_ids_option(
        requeue, "Only these dead letter ids of --queue (repeatable); all of its when omitted."
    )
    requeue.add_argument(
        "--dry-run", action="store_true", help="Say how many would move; move nothing."
    )
    retry = sub.add_parser(
        "retry",
        help="Make jobs waiting for a retry (their backoff) due now, by id, queue or tag.",
    )
    retry.add_argument("--queue", default=None, help="Every waiting job of this queue.")
    retry.add_argument(
        "--tag", type=tag_argument, default=None, help="Every waiting job with this tag."
    )
    add_ids_option(retry, "Only these job ids (repeatable); with --queue, only if they are in it.")


def _scope(tag: str | None, queue: str | None, word: str = "in") -> str:
    """Return the selection as words: `` tagged 'x' in queue 'q'`` (empty for neither)."""
    return ("" if tag is None else f" tagged {tag!r}") + (
        "" if queue is None else f" {word} queue {queue!r}"
    )


def _one_selection(ids: list[int] | None, tag: str | None, what: str) -> None:
    if ids is not None and tag is not None:
        # The id check is all or nothing by id; a tag selects by itself.
        raise CommandError(f"Give --id or --tag, not both: nothing {what}.")


class RepairCommands:
    """The ``requeue`` and ``retry`` subcommands, for the ``alkstore`` command."""

    stdout: Any
    style: Any
    _progress: Callable[[str], Any]

    def requeue(
        self,
        using: str,
        queue: str | None,
        ids: list[int] | None,
        *,
        dry_run: bool,
        tag: str | None = None,
    ) -> None:
        if queue is None and tag is None:
            raise CommandError(
                "Nothing to requeue: give --queue QUEUE (with --id to pick ids), --tag TAG, "
                "or both."
            )
        _one_selection(ids, tag, "requeued")
        scope = _scope(tag, queue, "of")
        if ids is not None:
            # All or nothing: a mistyped id must not requeue the others silently.
            missing = operations.missing_dead(ids, queue=queue, using=using)
            if missing:
                raise CommandError(
                    f"No dead letter {listed(missing)} in queue {queue!r}: nothing requeued."
                )
        if dry_run:
            count = (
                len(set(ids))
                if ids is not None
                else operations.count_dead(queue, tag=tag, using=using)
            )
            if count == 0:
                self._nothing_in(using, queue, tag)
            self.stdout.write(f"Would requeue {count} dead letter(s){scope}.")
            return
        moved = operations.requeue_dead(
            ids, queue=queue, tag=tag, using=using, progress=self._progress("requeued")
        )
        if moved == 0:
            self._nothing_in(using, queue, tag)
        self.stdout.write(self.style.SUCCESS(f"Requeued {moved} dead letter(s){scope}."))

    @staticmethod
    def _nothing_in(using: str, queue: str | None, tag: str | None) -> None:
        if tag is not None:
            raise CommandError(f"No dead letter{_scope(tag, queue)}: nothing requeued.")
        queues = operations.dead_letter_queues(using=using)
        known = ", ".join(map(repr, queues)) if queues else "none"
        raise CommandError(
            f"Queue {queue!r} has no dead letters: nothing requeued. "
            f"Queues with dead letters: {known}."
        )

    def retry(
        self, using: str, queue: str | None, ids: list[int] | None, tag: str | None = None
    ) -> None:
        if queue is None and ids is None and tag is None:
            raise CommandError(
                "Nothing to retry: give --id JOB_ID (repeatable), --queue QUEUE, --tag TAG, "
                "or --queue with one of the others."
            )
        _one_selection(ids, tag, "retried")
        where = "" if queue is None else f" in queue {queue!r}"
        if ids is not None:
            # All or nothing: a mistyped id must not retry the others silently.
            missing = operations.not_waiting(ids, queue=queue, using=using)
            if missing:
                raise CommandError(
                    f"No job {listed(missing)} waiting for a retry{where} (unknown, running, "
                    "due already, or never attempted): nothing retried."
                )
        retried = operations.retry_now(ids, queue=queue, tag=tag, using=using)
        tagged = "" if tag is None else f" tagged {tag!r}"
        if retried == 0 and ids is None:
            raise CommandError(f"No job{tagged} waiting for a retry{where}: nothing retried.")
        self.stdout.write(self.style.SUCCESS(f"Made {retried} job(s){tagged}{where} due now."))
