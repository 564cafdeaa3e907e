"""``manage.py alkstore``: queues, dead letters, retries, schedules, workflows, kept results."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.core.serializers.json import DjangoJSONEncoder

from ... import operations
from ...conf import app_settings
from ...display import (
    STEP_COLUMNS,
    WORKFLOW_COLUMNS,
    error_summary,
    format_age,
    format_timestamp,
    step_row,
    workflow_data,
    workflow_row,
)
from ...errors import AlkstoreError
from ...history import attempts_of
from ...overview import every_queue_overview, queue_overview
from ...records import Job, Schedule
from ...store import Store
from ..arguments import accept_common_options, database_alias, positive_int
from ..cancel import add_cancel_parser, cancel_by_id
from ..repairs import RepairCommands, add_repair_parsers
from ..service import require_migrated

STATS_COLUMNS = (
    "queue", "pending", "scheduled", "processing", "overdue", "dead", "oldest pending", "state",
)  # fmt: skip
DEAD_COLUMNS = ("id", "queue", "attempts", "died at", "error")
SCHEDULE_COLUMNS = ("name", "spec", "zone", "misfire", "queue", "state", "from",
                    "next run (zone)", "next run (UTC)", "last fired", "last error")  # fmt: skip


def add_limit(parser: Any) -> None:
    """Give a listing its ``--limit`` (how many rows, newest first)."""
    parser.add_argument(
        "--limit",
        type=positive_int(operations.MAX_LIST_LIMIT),
        default=operations.DEFAULT_LIST_LIMIT,
        help=f"How many (default {operations.DEFAULT_LIST_LIMIT}).",
    )


class Command(RepairCommands, BaseCommand):
    help = (
        "Inspect and repair queues: stats, pause, resume, dead letters (list, show), requeue, "
        "retry (jobs waiting for a retry, due now), cancel (live jobs, running ones stopped), "
        "purge-dead, schedules, workflows (list, show, cancel), kept job results."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--database",
            type=database_alias,
            default=None,
            help="The database alias of the alkstore tables (default: ALKSTORE['DATABASE']).",
        )
        sub = parser.add_subparsers(dest="subcommand", required=True)
        stats = sub.add_parser("stats", help="Print every queue's counts.")
        stats.add_argument("--json", action="store_true", help="Print JSON for machines.")
        pause = sub.add_parser(
            "pause", help="Stop every worker claiming from a queue (running jobs finish)."
        )
        pause.add_argument("queue", help="The queue to pause.")
        resume = sub.add_parser("resume", help="Let workers claim from a paused queue again.")
        resume.add_argument("queue", help="The queue to resume.")
        dead = sub.add_parser("dead", help="List dead letters, or show one.")
        dead_sub = dead.add_subparsers(dest="dead_command", required=True)
        listing = dead_sub.add_parser("list", help="The newest dead letters, newest first.")
        listing.add_argument("--queue", default=None, help="Only this queue's dead letters.")
        add_limit(listing)
        listing.add_argument("--json", action="store_true", help="Print JSON for machines.")
        show = dead_sub.add_parser("show", help="One dead letter: stamps, payload, full error.")
        show.add_argument("id", type=int, help="The dead letter's id (the job's id).")
        show.add_argument("--json", action="store_true", help="Print JSON for machines.")
        add_repair_parsers(sub)
        add_cancel_parser(sub)
        schedules = sub.add_parser(
            "schedules", help="List the schedules: next runs, last fire, last error."
        )
        schedules.add_argument("--json", action="store_true", help="Print JSON for machines.")
        purge = sub.add_parser("purge-dead", help="Delete a queue's old dead letters.")
        purge.add_argument("--queue", required=True, help="The queue whose dead letters to purge.")
        purge.add_argument(
            "--older-than",
            required=True,
            help="Age such as 30s, 15m, 12h or 7d: dead letters that died longer ago go.",
        )
        self._add_workflow_commands(sub)
        for subparser in [*sub.choices.values(), *dead_sub.choices.values()]:
            accept_common_options(subparser)

    @staticmethod
    def _add_workflow_commands(sub: Any) -> None:
        workflows = sub.add_parser("workflows", help="The newest workflows, newest first.")
        workflows.add_argument(
            "--state", default=None, help="Only these: running, succeeded, failed or cancelled."
        )
        add_limit(workflows)
        workflows.add_argument("--json", action="store_true", help="Print JSON for machines.")
        workflow = sub.add_parser("workflow", help="One workflow and its steps, in order.")
        workflow.add_argument("id", type=int, help="The workflow's id.")
        workflow.add_argument("--json", action="store_true", help="Print JSON for machines.")
        cancel = sub.add_parser(
            "cancel-workflow", help="Cancel a workflow's unfinished steps (running ones finish)."
        )
        cancel.add_argument("id", type=int, help="The workflow's id.")
        result = sub.add_parser(
            "result", help="What became of a job enqueued with keep_result_s, and its value."
        )
        result.add_argument("job_id", type=int, help="The job's id.")
        result.add_argument("--json", action="store_true", help="Print JSON for machines.")

    def handle(self, *args: Any, **options: Any) -> None:
        # A subcommand about one queue acts where that queue's jobs live.
        queue = options.get("queue")
        using = options["database"] or (
            app_settings.queue_alias(queue) if queue else app_settings.database
        )
        command = options["subcommand"]
        require_migrated(using)
        try:
            if command == "stats":
                self.stats(options["database"], as_json=options["json"])
            elif command in ("pause", "resume"):
                self.pause(using, options["queue"], paused=command == "pause")
            elif command == "dead" and options["dead_command"] == "list":
                self.dead_list(using, options["queue"], options["limit"], as_json=options["json"])
            elif command == "dead":
                self.dead_show(using, options["id"], as_json=options["json"])
            elif command == "schedules":
                self.schedules(using, as_json=options["json"])
            elif command == "requeue":
                self.requeue(
                    using,
                    options["queue"],
                    options["ids"],
                    dry_run=options["dry_run"],
                    tag=options["tag"],
                )
            elif command == "retry":
                self.retry(using, options["queue"], options["ids"], options["tag"])
            elif command == "workflows":
                self.workflows(
                    Store(using), options["state"], options["limit"], as_json=options["json"]
                )
            elif command == "workflow":
                self.workflow(Store(using), options["id"], as_json=options["json"])
            elif command == "cancel":
                cancel_by_id(self, using, options["ids"])
            elif command == "cancel-workflow":
                self.cancel_workflow(Store(using), options["id"])
            elif command == "result":
                self.result(Store(using), options["job_id"], as_json=options["json"])
            else:
                self.purge(using, options["queue"], options["older_than"])
        except AlkstoreError as exc:
            raise CommandError(str(exc)) from exc

    # --- output ----------------------------------------------------------------------

    def _json(self, value: Any) -> None:
        self.stdout.write(json.dumps(value, indent=2, cls=DjangoJSONEncoder, ensure_ascii=False))

    def _table(self, header: Sequence[str], rows: Sequence[Sequence[str]], align: str) -> None:
        """Print ``rows`` under ``header``; ``align`` has an ``l`` or ``r`` per column."""
        table = [tuple(header), *rows]
        widths = [max(len(row[i]) for row in table) for i in range(len(header))]
        for n, row in enumerate(table):
            cells = [
                value.ljust(width) if side == "l" else value.rjust(width)
                for value, width, side in zip(row, widths, align, strict=True)
            ]
            self.stdout.write("  ".join(cells).rstrip())
            if n == 0:
                self.stdout.write("  ".join("-" * w for w in widths))

    def _progress(self, verb: str) -> Any:
        def report(done: int) -> None:
            self.stdout.write(f"  {verb} {done}…")

        return report

    # --- subcommands ---------------------------------------------------------------

    def stats(self, using: str | None, *, as_json: bool) -> None:
        """Every alias's queues, or with ``--database`` that alias's only."""
        stats = queue_overview(using=using) if using else every_queue_overview()
        if as_json:
            self._json([asdict(s) for s in stats])
            return
        if not stats:
            self.stdout.write("No queues.")
            return
        rows = [
            (
                s.queue,
                *map(str, (s.pending, s.scheduled, s.processing, s.overdue, s.dead)),
                format_age(s.oldest_pending_age_s),
                "paused" if s.paused else "running",
                s.database,
            )
            for s in stats
        ]
        if len({s.database for s in stats}) > 1:
            self._table((*STATS_COLUMNS, "database"), rows, "lrrrrrrll")
        else:
            self._table(STATS_COLUMNS, [row[:-1] for row in rows], "lrrrrrrl")

    def pause(self, using: str, queue: str, *, paused: bool) -> None:
        changed = operations.set_queue_paused(queue, paused, using=using)
        if paused and changed:
            self.stdout.write(
                f"Paused queue {queue!r}: workers claim nothing from it; running jobs finish, "
                "enqueues are kept."
            )
        elif paused:
            self.stdout.write(f"Queue {queue!r} was already paused: nothing changed.")
        elif changed:
            self.stdout.write(f"Resumed queue {queue!r}: workers claim from it again.")
        else:
            self.stdout.write(f"Queue {queue!r} was not paused: nothing changed.")

    def schedules(self, using: str, *, as_json: bool) -> None:
        schedules = operations.list_schedules(using=using)
        if as_json:
            self._json(
                [
                    {**asdict(s), "next_run_in_zone": _in_zone(s.next_run_at, s.zone)}
                    for s in schedules
                ]
            )
            return
        if not schedules:
            self.stdout.write("No schedules.")
            return
        rows = [
            (
                s.name, s.spec, s.zone, s.misfire, s.queue,
                "active" if s.enabled else "paused",
                "settings" if s.declared else "code",
                _in_zone(s.next_run_at, s.zone)[:19].replace("T", " "),
                f"{s.next_run_at.astimezone(UTC):%Y-%m-%d %H:%M:%S}",
                format_timestamp(s.last_fired_at),
                _schedule_error(s),
            )
            for s in schedules
        ]  # fmt: skip
        self._table(SCHEDULE_COLUMNS, rows, "lllllllllll")

    def dead_list(self, using: str, queue: str | None, limit: int, *, as_json: bool) -> None:
        dead = operations.list_dead(queue=queue, limit=limit, using=using)
        if as_json:
            self._json([asdict(job) for job in dead])
            return
        if not dead:
            where = "" if queue is None else f" in queue {queue!r}"
            self.stdout.write(f"No dead letters{where}.")
            return
        rows = [
            (
                str(job.id),
                job.queue,
                f"{job.attempts}/{job.max_attempts}",
                format_timestamp(job.died_at),
                error_summary(job.last_error),
            )
            for job in dead
        ]
        self._table(DEAD_COLUMNS, rows, "rlrll")

    def dead_show(self, using: str, job_id: int, *, as_json: bool) -> None:
        job = operations.get_dead(job_id, using=using)
        if job is None:
            raise CommandError(f"No dead letter with id {job_id}.")
        history = attempts_of(job_id, using)
        if as_json:
            self._json(
                {
                    **asdict(job),
                    "attempt_history": [
                        {
                            "attempt": a.attempt,
                            "failed_at": a.failed_at,
                            "worker_id": a.worker_id,
                            "error": a.error,
                            "exception_class": a.exception_class,
                            "traceback": a.traceback,
                        }
                        for a in history
                    ],
                }
            )
            return
        self._describe(job)
        if history:
            self.stdout.write("attempt history:")
        for a in history:
            self.stdout.write(
                f"  attempt {a.attempt}  {format_timestamp(a.failed_at)}  {a.worker_id or '-'}  "
                f"{error_summary(a.error)}"
            )

    def workflows(self, store: Store, state: str | None, limit: int, *, as_json: bool) -> None:
        workflows = store.list_workflows(state=state, limit=limit)
        if as_json:
            self._json([workflow_data(w, with_steps=False) for w in workflows])
            return
        if not workflows:
            self.stdout.write("No workflows." if state is None else f"No {state} workflows.")
            return
        self._table(WORKFLOW_COLUMNS, [workflow_row(w) for w in workflows], "rlllll")

    def workflow(self, store: Store, workflow_id: int, *, as_json: bool) -> None:
        workflow = store.get_workflow(workflow_id)
        if workflow is None:
            raise CommandError(f"No workflow {workflow_id}.")
        if as_json:
            self._json(workflow_data(workflow))
            return
        self._fields(
            ("id", str(workflow.id)),
            ("name", workflow.name or "-"),
            ("state", workflow.state),
            ("steps done", f"{workflow.steps_done} of {workflow.steps_total}"),
            ("created", format_timestamp(workflow.created_at)),
            ("finished", format_timestamp(workflow.finished_at)),
        )
        self.stdout.write("")
        self._table(STEP_COLUMNS, [step_row(s) for s in workflow.steps.values()], "llllrll")

    def cancel_workflow(self, store: Store, workflow_id: int) -> None:
        if store.cancel_workflow(workflow_id):
            self.stdout.write(
                self.style.SUCCESS(
                    f"Cancelled workflow {workflow_id}: its unfinished steps are cancelled and "
                    "their jobs deleted; a step already running finishes."
                )
            )
            return
        workflow = store.get_workflow(workflow_id)
        if workflow is None:
            raise CommandError(f"No workflow {workflow_id}.")
        self.stdout.write(
            f"Workflow {workflow_id} had already finished ({workflow.state}): nothing cancelled."
        )

    def result(self, store: Store, job_id: int, *, as_json: bool) -> None:
        result = store.get_result(job_id)
        if result is None:
            job = store.get_job(job_id)
            if job is not None and job.state != "dead":
                raise CommandError(f"No result for job {job_id} yet: it is {job.state}.")
            raise CommandError(
                f"No result for job {job_id}: unknown, expired, or not kept "
                "(enqueue it with keep_result_s to keep one)."
            )
        if as_json:
            self._json(asdict(result))
            return
        self._fields(
            ("job id", str(result.job_id)),
            ("queue", result.queue),
            ("state", result.state),
            ("attempts", str(result.attempts)),
            ("finished at", format_timestamp(result.finished_at)),
            ("expires at", format_timestamp(result.expires_at)),
        )
        self.stdout.write("value:")
        self.stdout.write(json.dumps(result.value, indent=2, ensure_ascii=False, sort_keys=True))
        self.stdout.write("error:")
        self.stdout.write(result.error or "")

    def _fields(self, *fields: tuple[str, str]) -> None:
        """Print ``name  value`` lines, the values aligned."""
        width = max(len(name) for name, _ in fields)
        for name, value in fields:
            self.stdout.write(f"{name.ljust(width)}  {value}")

    def _describe(self, job: Job) -> None:
        fields = (
            ("id", str(job.id)),
            ("queue", job.queue),
            ("attempts", f"{job.attempts} of {job.max_attempts}"),
            ("died at", format_timestamp(job.died_at)),
            ("enqueued at", format_timestamp(job.enqueued_at)),
            ("run at", format_timestamp(job.run_at)),
            ("expires at", format_timestamp(job.expires_at)),
            ("priority", str(job.priority)),
            ("time limit", "-" if job.timeout_s is None else f"{job.timeout_s:g} s"),
            ("last worker", job.worker_id or "-"),
            ("tags", ", ".join(job.tags) or "-"),
        )
        self._fields(*fields)
        self.stdout.write("payload:")
        payload = json.dumps(job.payload, indent=2, ensure_ascii=False, sort_keys=True)
        self.stdout.write(payload)
        self.stdout.write("error:")
        self.stdout.write(job.last_error or "")

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


def _in_zone(instant: datetime, zone: str) -> str:
    """Return ``instant`` as ISO 8601 in the schedule's zone (UTC if the zone is gone)."""
    try:
        return instant.astimezone(ZoneInfo(zone)).isoformat()
    except (ValueError, KeyError):
        return instant.astimezone(UTC).isoformat()


def _schedule_error(schedule: Schedule) -> str:
    summary = error_summary(schedule.last_error) or "-"
    if schedule.refused_from is None:
        return summary
    return f"REFUSED since {format_timestamp(schedule.refused_from)}: {summary}"
