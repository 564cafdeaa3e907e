"""``manage.py alkstore``: queue stats, requeue dead letters, purge old dead letters."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ... import operations
from ...conf import app_settings
from ...display import format_age
from ...errors import AlkstoreError

COLUMNS = ("queue", "pending", "scheduled", "processing", "overdue", "dead", "oldest pending")


class Command(BaseCommand):
    help = "Inspect and repair queues: stats, requeue dead letters, purge old dead letters."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--database",
            default=None,
            help="The database alias of the alkstore tables (default: ALKSTORE['DATABASE']).",
        )
        sub = parser.add_subparsers(dest="subcommand", required=True)
        stats = sub.add_parser("stats", help="Print every queue's counts.")
        stats.add_argument("--json", action="store_true", help="Print JSON for machines.")
        requeue = sub.add_parser("requeue", help="Requeue a queue's dead letters (or some ids).")
        requeue.add_argument("--queue", required=True, help="The queue whose dead letters to move.")
        requeue.add_argument(
            "--id",
            dest="ids",
            type=int,
            nargs="+",
            action="extend",
            help="Only these dead letter ids (repeatable); all of the queue's when omitted.",
        )
        purge = sub.add_parser("purge-dead", help="Delete a queue's old dead letters.")
        purge.add_argument("--queue", required=True, help="The queue whose dead letters to purge.")
        purge.add_argument(
            "--older-than",
            required=True,
            help="Age such as 30s, 15m, 12h or 7d: dead letters that died longer ago go.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        using = options["database"] or app_settings.database
        try:
            if options["subcommand"] == "stats":
                self.stats(using, as_json=options["json"])
            elif options["subcommand"] == "requeue":
                self.requeue(using, options["queue"], options["ids"])
            else:
                self.purge(using, options["queue"], options["older_than"])
        except AlkstoreError as exc:
            raise CommandError(str(exc)) from exc

    def stats(self, using: str, *, as_json: bool) -> None:
        stats = operations.queue_overview(using=using)
        if as_json:
            self.stdout.write(json.dumps([asdict(s) for s in stats], indent=2))
            return
        if not stats:
            self.stdout.write("No queues.")
            return
        table: list[tuple[str, ...]] = [COLUMNS]
        for s in stats:
            counts = (s.pending, s.scheduled, s.processing, s.overdue, s.dead)
            table.append((s.queue, *map(str, counts), format_age(s.oldest_pending_age_s)))
        widths = [max(len(row[i]) for row in table) for i in range(len(COLUMNS))]
        for n, row in enumerate(table):
            cells = [row[0].ljust(widths[0])]
            cells += [v.rjust(w) for v, w in zip(row[1:], widths[1:], strict=True)]
            self.stdout.write("  ".join(cells).rstrip())
            if n == 0:
                self.stdout.write("  ".join("-" * w for w in widths))

    def _progress(self, verb: str) -> Any:
        def report(done: int) -> None:
            self.stdout.write(f"  {verb} {done}…")

        return report

    def requeue(self, using: str, queue: str, ids: list[int] | None) -> None:
        moved = operations.requeue_dead(
            ids, queue=queue, using=using, progress=self._progress("requeued")
        )
        self.stdout.write(
            self.style.SUCCESS(f"Requeued {moved} dead letter(s) of queue {queue!r}.")
        )

    def purge(self, using: str, queue: str, older_than: str) -> None:
        try:
            older_than_s = operations.parse_age(older_than)
        except AlkstoreError as exc:
            raise CommandError(
                f"Invalid --older-than {older_than!r}: expected a positive whole number "
                "followed by s, m, h or d, such as 30s, 15m, 12h or 7d."
            ) from exc
        deleted = operations.purge_dead(
            queue, older_than_s, using=using, progress=self._progress("deleted")
        )
        self.stdout.write(
            self.style.SUCCESS(
                f"Deleted {deleted} dead letter(s) of queue {queue!r} older than {older_than}."
            )
        )
