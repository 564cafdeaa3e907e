"""``manage.py runworker``: run the registered handlers until SIGTERM/SIGINT."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from alkstore_django.errors import AlkstoreError
from alkstore_django.handlers import outbox_queue_name, registry
from alkstore_django.instruments import Instruments
from alkstore_django.pools import POOLS
from alkstore_django.sentinel import start_sentinel
from alkstore_django.worker import Worker

# Far above any useful thread count, low enough that a typo cannot start
# a hundred thousand threads or hold a whole queue under one worker's claim.
MAX_COUNT = 1024
# A thread-pool worker whose handler passed its time limit exits with this
# (EX_TEMPFAIL) once its grace period is over, for its supervisor to restart it.
EXIT_TIMED_OUT = 75


def positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if not 1 <= number <= MAX_COUNT:
        raise CommandError(
            f"Invalid value {value!r}: expected a positive integer up to {MAX_COUNT}."
        )
    return number


def positive_int_any(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise CommandError(f"Invalid value {value!r}: expected a positive integer.")
    return number


def port_number(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if not 1 <= number <= 65535:
        raise CommandError(f"Invalid port {value!r}: expected an integer from 1 to 65535.")
    return number


def non_negative_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not number >= 0:
        raise CommandError(f"Invalid value {value!r}: expected a number of seconds >= 0.")
    return number


class Command(BaseCommand):
    help = "Run the handlers of the named queues and outboxes (all registered ones by default)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--queue", action="append", default=[], help="A queue to work on.")
        parser.add_argument("--outbox", action="append", default=[], help="An outbox to deliver.")
        parser.add_argument("--concurrency", type=positive_int, default=4, help="Handler threads.")
        parser.add_argument(
            "--batch", type=positive_int, default=None, help="Most jobs held under claim at once."
        )
        parser.add_argument("--worker-id", default=None, help="Defaults to host:pid:random.")
        parser.add_argument("--burst", action="store_true", help="Drain what is due, then exit.")
        parser.add_argument(
            "--pool",
            choices=POOLS,
            default="threads",
            help="Where handlers run: threads (default) or processes (one child per "
            "--concurrency slot: hard time limits, crash isolation, memory recycling).",
        )
        parser.add_argument(
            "--max-jobs-per-child",
            type=positive_int_any,
            default=None,
            help="Process pool: replace a child after this many jobs.",
        )
        parser.add_argument(
            "--max-memory-per-child",
            type=positive_int_any,
            default=None,
            metavar="MB",
            help="Process pool: replace a child once its resident memory passes this many MB.",
        )
        parser.add_argument(
            "--metrics-port",
            type=port_number,
            default=None,
            help="Serve this worker's Prometheus metrics on this port (needs the 'metrics' extra).",
        )
        parser.add_argument(
            "--grace-s",
            type=non_negative_float,
            default=30.0,
            help="On SIGTERM, how long running jobs may finish before their claims are released.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self._configure_logging(options["verbosity"])
        names = list(options["queue"]) + [outbox_queue_name(n) for n in options["outbox"]]
        unknown = [n for n in names if registry.get(n) is None]
        if unknown:
            known = ", ".join(repr(n) for n in registry.queues()) or "none (add a jobs.py)"
            raise CommandError(f"No handler for {unknown[0]!r}: registered queues are {known}.")
        if not names and not registry.queues():
            raise CommandError("No handlers are registered: add @handler functions in a jobs.py.")
        stop = threading.Event()
        self._install_signals(stop)
        try:
            instruments = self._instruments(options["metrics_port"])
            worker = Worker(
                names or None,
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
            worker.build_queues()
            start_sentinel(worker)
            if instruments.enabled:
                # After the sentinel's fork: the server is a thread.
                from prometheus_client import start_http_server

                start_http_server(options["metrics_port"], registry=instruments.registry)
            worker.run(stop)
        except AlkstoreError as exc:
            raise CommandError(str(exc)) from exc
        if worker.broken:
            raise CommandError(f"The worker stopped: it {worker.broken}.")
        if worker.timed_out or worker.running_threads():
            # A handler outlived its time limit or the grace period and its attempt
            # is recorded: end it with the process, before anyone runs it again. A
            # stuck thread asks the supervisor for a fresh process (non-zero exit).
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(EXIT_TIMED_OUT if worker.timed_out else 0)

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

    @staticmethod
    def _install_signals(stop: threading.Event) -> None:
        def on_signal(signum: int, frame: Any) -> None:
            if stop.is_set():
                # A second signal: leave at once; held claims lapse and are reclaimed.
                sys.stderr.write("alkstore: second signal, exiting now\n")
                sys.stderr.flush()
                os._exit(128 + signum)
            stop.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

    @staticmethod
    def _configure_logging(verbosity: int) -> None:
        logger = logging.getLogger("alkstore_django")
        if logger.handlers or logging.getLogger().handlers:
            return
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.WARNING if verbosity == 0 else logging.INFO)
