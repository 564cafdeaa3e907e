"""``manage.py runworker``: run the registered handlers until SIGTERM/SIGINT."""

from __future__ import annotations

import atexit
import gc
import os
import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import autoreload

from alkstore_django.errors import AlkstoreError
from alkstore_django.handlers import outbox_queue_name, registry
from alkstore_django.management.arguments import database_alias, positive_int, seconds
from alkstore_django.management.service import exit_now, refuse_atomic_block, start_service
from alkstore_django.worker import Worker
from alkstore_django.worker.crew import run_together, workers_for
from alkstore_django.worker.instruments import Instruments
from alkstore_django.worker.pools import POOLS
from alkstore_django.worker.sentinel import finish_sentinel, start_sentinel

# Far above any useful thread count, low enough that a typo cannot start
# a hundred thousand threads or hold a whole queue under one worker's claim.
MAX_COUNT = 1024
# A thread-pool worker whose handler passed its time limit exits with this
# (EX_TEMPFAIL) once its grace period is over, for its supervisor to restart it.
EXIT_TIMED_OUT = 75
MAX_GRACE_S = 86_400.0
MAX_PORT = 65_535
# The metrics carry queue names and counts: reachable from this host only unless asked.
DEFAULT_METRICS_HOST = "127.0.0.1"
# Beyond the grace period, how long a code change waits for the worker to let go.
AUTORELOAD_STOP_MARGIN_S = 5.0


def serve_with_reloader(workers: list[Worker], stop: threading.Event) -> None:
    """Run ``workers`` under Django's autoreloader, restarting them when code changes.

    The reloader runs the worker in a thread and ends the process when a file
    changes (or on SIGTERM): an exit hook first stops the worker the usual
    way, so unstarted jobs go back and running ones get the grace period,
    instead of waiting for their claims to lapse. A Ctrl-C stops the worker,
    then the reloader (through the SIGTERM handler Django's reloader
    installs). Development only: there is no sentinel (forking beside the
    reloader's thread is not safe), so a crash leaves claims to lapse.
    """
    started, finished, reloading = threading.Event(), threading.Event(), threading.Event()

    def serve() -> None:
        started.set()
        try:
            run_together(workers, stop)
        finally:
            finished.set()
            if not reloading.is_set():
                # Stopped by a signal: end the reloader too (its SIGTERM handler exits).
                os.kill(os.getpid(), signal.SIGTERM)

    def stop_worker() -> None:
        if not started.is_set():
            return  # the reloader's own process: the worker runs in its child
        reloading.set()
        stop.set()
        finished.wait(workers[0].grace_s + AUTORELOAD_STOP_MARGIN_S)

    atexit.register(stop_worker)
    autoreload.run_with_reloader(serve)


class Command(BaseCommand):
    help = (
        "Run the handlers of the named queues and outboxes (all registered ones by default). "
        "-v 0 logs warnings only, -v 2 and 3 add debug lines, unless LOGGING handles alkstore."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--queue", action="append", default=[], help="A queue to work on.")
        parser.add_argument("--outbox", action="append", default=[], help="An outbox to deliver.")
        parser.add_argument(
            "--concurrency",
            type=positive_int(MAX_COUNT),
            default=4,
            help="Handler slots: threads, children or coroutines at once.",
        )
        parser.add_argument(
            "--batch",
            type=positive_int(MAX_COUNT),
            default=None,
            help="Most jobs held under claim at once.",
        )
        parser.add_argument("--worker-id", default=None, help="Defaults to host:pid:random.")
        parser.add_argument(
            "--database",
            type=database_alias,
            default=None,
            help="The alias of the queues no QUEUES 'database' option routes elsewhere "
            "(default: ALKSTORE['DATABASE']).",
        )
        parser.add_argument("--burst", action="store_true", help="Drain what is due, then exit.")
        parser.add_argument(
            "--pool",
            choices=POOLS,
            default="threads",
            help="Where handlers run: threads (default), processes (one child per "
            "--concurrency slot: hard time limits, crash isolation, memory recycling) or "
            "asyncio (one event loop running up to --concurrency async def handlers).",
        )
        parser.add_argument(
            "--max-jobs-per-child",
            type=positive_int(),
            default=None,
            help="Process pool: replace a child after this many jobs.",
        )
        parser.add_argument(
            "--max-memory-per-child",
            type=positive_int(),
            default=None,
            metavar="MB",
            help="Process pool: replace a child once its resident memory passes this many MB.",
        )
        parser.add_argument(
            "--metrics-port",
            type=positive_int(MAX_PORT),
            default=None,
            help="Serve this worker's Prometheus metrics on this port (needs the 'metrics' extra).",
        )
        parser.add_argument(
            "--metrics-host",
            default=DEFAULT_METRICS_HOST,
            help="The address --metrics-port listens on (default 127.0.0.1, this host only; "
            "0.0.0.0 for every interface).",
        )
        parser.add_argument(
            "--autoreload",
            action="store_true",
            help="Development: restart the worker when Python code changes, as runserver does.",
        )
        parser.add_argument(
            "--grace-s",
            type=seconds(MAX_GRACE_S, zero_allowed=True),
            default=30.0,
            help="On SIGTERM, how long running jobs may finish (0 to 86400 seconds).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        names = list(options["queue"]) + [outbox_queue_name(n) for n in options["outbox"]]
        try:
            # get() refuses a queue with two handlers, with the alkstore.E201 message.
            unknown = [n for n in names or registry.queues() if registry.get(n) is None]
        except AlkstoreError as exc:
            raise CommandError(str(exc)) from exc
        if unknown:
            known = ", ".join(repr(n) for n in registry.queues()) or "none (add a jobs.py)"
            raise CommandError(f"No handler for {unknown[0]!r}: registered queues are {known}.")
        if not names and not registry.queues():
            raise CommandError("No handlers are registered: add @handler functions in a jobs.py.")
        database = options["database"]
        try:
            instruments = self._instruments(options["metrics_port"])
            workers = workers_for(
                names or None,
                database=database,
                concurrency=options["concurrency"],
                batch=options["batch"],
                worker_id=options["worker_id"],
                burst=options["burst"],
                grace_s=options["grace_s"],
                pool=options["pool"],
                max_jobs_per_child=options["max_jobs_per_child"],
                max_memory_per_child_mb=options["max_memory_per_child"],
                instruments=instruments,
            )
            aliases = [worker.store.using for worker in workers]
            for alias in aliases:
                refuse_atomic_block(alias, "runworker", "alkstore_django.testing.run_ready_jobs()")
            stop = start_service(options["verbosity"], *aliases)
            for worker in workers:
                worker.build_queues()
            if options["autoreload"]:
                serve_with_reloader(workers, stop)
                return
            # Django, the app registry and the modules live as long as the
            # process: frozen, the collector no longer walks them (a worker
            # allocates per job, so it collects often), and the sentinel's fork
            # keeps sharing their pages instead of copying each page the
            # collector would write to. Measured: 50 ms less CPU at start-up.
            gc.freeze()
            sentinel = start_sentinel(workers)
            try:
                self._serve(workers, stop, options, instruments)
            finally:
                # Exit after the sentinel: a supervisor signalling the group once the
                # command has exited must not catch it mid-settle.
                # Not for a thread that did not stop at its time limit: its sentinel
                # records that attempt only once this process has exited.
                if not any(worker.timed_out for worker in workers):
                    finish_sentinel(workers, sentinel)
        except AlkstoreError as exc:
            raise CommandError(str(exc)) from exc
        broken = next((worker.broken for worker in workers if worker.broken), None)
        if broken:
            raise CommandError(f"The worker stopped: it {broken}.")
        timed_out = any(worker.timed_out for worker in workers)
        if timed_out or any(worker.running_threads() for worker in workers):
            # A handler outlived its time limit or the grace period and its attempt
            # is recorded: end it with the process, before anyone runs it again. A
            # stuck thread asks the supervisor for a fresh process (non-zero exit).
            exit_now(EXIT_TIMED_OUT if timed_out else 0)

    @staticmethod
    def _serve(
        workers: list[Worker],
        stop: threading.Event,
        options: dict[str, Any],
        instruments: Instruments,
    ) -> None:
        """Serve the metrics if asked, then run ``workers`` until ``stop``."""
        if instruments.enabled:
            # After the sentinel's fork: the server is a thread.
            from prometheus_client import start_http_server

            start_http_server(
                options["metrics_port"],
                addr=options["metrics_host"],
                registry=instruments.registry,
            )
        run_together(workers, stop)

    @staticmethod
    def _instruments(port: int | None) -> Instruments:
        if port is None:
            return Instruments()
        try:
            from prometheus_client import CollectorRegistry, ProcessCollector
        except ImportError as exc:
            raise CommandError(
                "--metrics-port needs prometheus-client: pip install 'alkstore-django[metrics]'."
            ) from exc
        registry = CollectorRegistry()
        ProcessCollector(registry=registry)
        return Instruments(registry)
