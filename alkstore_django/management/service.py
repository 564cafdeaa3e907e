"""What ``runworker`` and ``runscheduler`` share: logging, migrations, signals, the hard exit.

Both are long-running processes an operator starts by hand, under systemd or
in a container, so both must say what they do without any ``LOGGING`` set-up,
refuse an unmigrated database at once instead of retrying forever, and stop
the same way on SIGTERM or SIGINT.
"""

from __future__ import annotations

import importlib
import logging
import os
import pkgutil
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from django.core.management.base import CommandError
from django.db import DEFAULT_DB_ALIAS, InterfaceError, OperationalError, connections
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.recorder import MigrationRecorder

APP_LABEL = "alkstore_django"
LOG_LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}
LOG_FORMAT = "%(asctime)s %(levelname)s %(message)s"
VERBOSE_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(threadName)s %(message)s"

logger = logging.getLogger(__name__)


def start_service(verbosity: int, *aliases: str) -> threading.Event:
    """Prepare a long-running command; return the event that SIGTERM/SIGINT sets.

    Raises ``CommandError`` when one of ``aliases`` lacks alkstore's migrations.
    """
    configure_logging(verbosity)
    for using in aliases:
        require_migrated(using)
    stop = threading.Event()
    install_stop_signals(stop)
    return stop


class _DefaultHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The stderr handler the commands add when the site's LOGGING gives alkstore none."""

    def write_batch(self, name: str, level: int, messages: Sequence[str]) -> None:
        """Write ``messages``, logged at one moment by logger ``name``, with one write.

        What ``emit`` would write for each, stamped once: the worker logs a
        line per acked job once a claim's commit has made a batch durable,
        and stderr is line-buffered, so each line was its own system call.
        The worker calls this only when this handler is the one its lines
        reach (``worker/tally.py``); a site's own handlers get every record.
        """
        # Both of the commands' formats end with the message: the line is the
        # head an empty message gets, then the message.
        record = logging.LogRecord(name, level, __file__, 0, "", None, None)
        head, end = self.format(record), self.terminator
        try:
            text = "".join([f"{head}{message}{end}" for message in messages])
            with self.lock:  # type: ignore[union-attr]
                self.stream.write(text)
                self.flush()
        except RecursionError:  # as StreamHandler.emit
            raise
        except Exception:  # noqa: BLE001 - a logging failure must not stop the worker
            self.handleError(record)


class _Formatter(logging.Formatter):
    """``logging.Formatter`` that turns the clock into text once a second, not once a line.

    A worker logs a line per job; ``strftime`` was an eighth of that line's
    cost. The text is the standard ``asctime`` (``2026-12-01 02:11:38,123``).
    """

    _second: tuple[int, str] = (-1, "")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt is not None or self.default_msec_format is None:
            return super().formatTime(record, datefmt)
        second = int(record.created)
        cached, text = self._second
        if second != cached:
            text = time.strftime(self.default_time_format, self.converter(record.created))
            # One tuple, so a thread never reads one second's text with another's number.
            self._second = (second, text)
        return self.default_msec_format % (text, record.msecs)


def _site_handles_alkstore() -> bool:
    if logging.getLogger().handlers:
        return True
    ours = [
        candidate
        for name, candidate in logging.Logger.manager.loggerDict.items()
        if (name == APP_LABEL or name.startswith(f"{APP_LABEL}."))
        and isinstance(candidate, logging.Logger)
    ]
    return any(not isinstance(h, _DefaultHandler) for lg in ours for h in lg.handlers)


def configure_logging(verbosity: int) -> None:
    """Log ``alkstore_django``'s lines to stderr at the level ``-v`` asks for.

    0: warnings and errors; 1 (the default): also one line per job outcome
    and every scheduler event; 2 and 3: also debug lines, with the logger and
    thread names. A site whose ``LOGGING`` gives the root logger or any
    ``alkstore_django`` logger a handler keeps its own set-up untouched.
    """
    root = logging.getLogger(APP_LABEL)
    handler = next((h for h in root.handlers if isinstance(h, _DefaultHandler)), None)
    if handler is None:
        if _site_handles_alkstore():
            return
        handler = _DefaultHandler()
        root.addHandler(handler)
    detailed = verbosity >= 2
    handler.setFormatter(_Formatter(VERBOSE_LOG_FORMAT if detailed else LOG_FORMAT))
    root.setLevel(LOG_LEVELS.get(verbosity, logging.DEBUG))


def require_migrated(using: str) -> None:
    """Raise ``CommandError`` saying "run migrate" when ``using`` lacks an alkstore migration.

    Checked once before serving: without it a worker on an unmigrated
    database takes "no such table" for an outage and retries forever. A
    database that cannot be reached is left to the service's own outage
    handling (it waits for the database to come back). Only this app's
    migration files and rows are read: loading the site's whole migration
    graph would cost every worker start a second on a large project.
    """
    module_name, _ = MigrationLoader.migrations_module(APP_LABEL)  # honours MIGRATION_MODULES
    if module_name is None:  # MIGRATION_MODULES turned them off: nothing to check
        return
    module = importlib.import_module(module_name)
    names = [m.name for m in pkgutil.iter_modules(module.__path__) if m.name[:4].isdigit()]
    try:
        recorder = MigrationRecorder(connections[using])
        applied = (
            set(recorder.migration_qs.filter(app=APP_LABEL).values_list("name", flat=True))
            if recorder.has_table()
            else set()
        )
    except (OperationalError, InterfaceError) as exc:
        logger.warning("migrations not checked: database %r unavailable (%s)", using, exc)
        return
    missing = sorted(name for name in names if name not in applied)
    if missing:
        option = "" if using == DEFAULT_DB_ALIAS else f" --database {using}"
        raise CommandError(
            f"Database {using!r} lacks {len(missing)} alkstore_django migration(s) "
            f"({', '.join(missing)}): run `manage.py migrate{option}` first."
        )


def refuse_atomic_block(using: str, command: str, instead: str) -> None:
    """Raise ``CommandError`` naming ``instead`` when ``using`` is inside an atomic block.

    A test's transaction (``TestCase``, ``django_db`` without
    ``transaction=True``) is such a block: the command's threads and children
    use connections of their own, which cannot see its uncommitted rows and,
    on SQLite, wait on its write lock until "database table is locked".
    Refused at once instead, with the in-process helper that works there.
    """
    if connections[using].in_atomic_block:
        raise CommandError(
            f"{command} cannot run inside an atomic block on database {using!r} (a test's "
            f"transaction): its threads use other connections, which cannot see this "
            f"transaction's rows. In a test, call {instead} instead."
        )


def exit_now(code: int) -> None:
    """End the process at once with ``code``, after flushing the logs and both streams.

    For a process whose threads cannot be joined (a handler past its time
    limit): ``sys.exit`` would wait for them. Nothing else runs: no atexit
    hook, no ``finally`` in another thread.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def install_stop_signals(stop: threading.Event) -> None:
    """Make the first SIGTERM or SIGINT set ``stop`` and a second one exit at once."""

    def on_signal(signum: int, frame: Any) -> None:
        if stop.is_set():
            # A second signal: leave at once; held claims and leases lapse and are retaken.
            sys.stderr.write("alkstore: second signal, exiting now\n")
            sys.stderr.flush()
            os._exit(128 + signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
