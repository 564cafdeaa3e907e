"""One handler run: the job a worker holds, and the outcome its handler decided.

Runs happen on the worker's handler threads; the outcome is handed back to
the main thread, which alone writes to the database for the worker.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import close_old_connections

from .errors import Fail
from .queues import JobHandle
from .records import Job

logger = logging.getLogger("alkstore_django.worker")


def tidy_connections(close: Callable[[], None]) -> None:
    """Close stale connections without ever killing the thread that asks.

    A handler thread that died here would silently shrink the pool; a
    connection that cannot even be closed is logged and left to be replaced.
    """
    try:
        close()
    except Exception:
        logger.warning("could not close a database connection", exc_info=True)


@dataclass
class Held:
    """A job this worker holds a claim on, running or waiting for a thread."""

    handle: JobHandle
    handler: Callable[[Job], Any]
    next_heartbeat_at: float
    started_at: float | None = None


@dataclass
class Outcome:
    """What a handler run decided; the main thread applies it."""

    held: Held
    kind: str  # "ack" | "retry" | "fail"
    value: Any = None
    error: str | None = None
    exc: BaseException | None = None
    duration_ms: float = 0.0


def run_held(held: Held) -> Outcome:
    """Run ``held``'s handler as a request would run a view: fresh connections around it.

    ``Fail`` means dead at once; any other exception means retry, and is
    logged with its traceback here, where it is still at hand.
    """
    held.started_at = time.monotonic()
    tidy_connections(close_old_connections)
    try:
        value = held.handler(held.handle.job)
        outcome = Outcome(held, "ack", value=value)
    except Fail as exc:
        outcome = Outcome(held, "fail", error=str(exc) or "failed", exc=exc)
    except BaseException as exc:
        logger.error(
            "handler raised id=%s queue=%s attempts=%s",
            held.handle.job.id,
            held.handle.job.queue,
            held.handle.job.attempts,
            exc_info=True,
        )
        outcome = Outcome(held, "retry", error=f"{type(exc).__name__}: {exc}", exc=exc)
    finally:
        tidy_connections(close_old_connections)
    outcome.duration_ms = (time.monotonic() - held.started_at) * 1000
    return outcome
