"""The run context: what a handler can ask of the attempt it is inside (``current_run()``).

A handler steers nothing through its payload: it asks its run whether a
cancel was requested and tells it how far it has got. The worker that runs
the handler owns the run: it sets ``cancel_requested`` when it hears of a
request (a notification, or its poll of the rows it holds) and writes the
progress the handler reports, at most once a second, with the claim's
heartbeat. A run is bound to the handler's context (a ``ContextVar``), so an
``async def`` handler sees it in its event loop as well, and a process-pool
child has a run of its own that mirrors its parent's.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .errors import Cancelled, InvalidArgument

if TYPE_CHECKING:
    from .records import Job

__all__ = ["Run", "bind", "current_run", "unbind"]

# At most one progress write a second per job; the last value is always written.
PROGRESS_INTERVAL_S = 1.0
MAX_NOTE_LENGTH = 200

_current: contextvars.ContextVar[Run | None] = contextvars.ContextVar("alkstore_run", default=None)


def current_run() -> Run | None:
    """Return the run of the handler this code is inside, or None outside a handler."""
    return _current.get()


def bind(run: Run) -> contextvars.Token[Run | None]:
    """Make ``run`` the current run until ``unbind(token)``.

    A pair of calls, not a context manager: ``contextmanager`` would cost
    every job a microsecond and a half.
    """
    return _current.set(run)


def unbind(token: contextvars.Token[Run | None]) -> None:
    """End what ``bind`` began: the run current before it is current again."""
    _current.reset(token)


class Run:
    """One attempt of one job, as its handler sees it.

        ``job`` is the claimed record. The cancel flag is set by the worker's
        main thread (or, in a child process, by its parent's signal) and read by
        the handler's; the progress is written by the handler's thread and taken
        by whoever writes it. The progress crosses threads under a lock; the flag
    is a plain attribute, written by one thread and read by another.
    """

    # One is made per claimed job: slots make it, and the reads of it, cheaper.
    __slots__ = (
        "_cancel",
        "_lock",
        "_progress",
        "job",
        "on_report",
        "progress_pending",
        "progress_written_at",
    )

    def __init__(self, job: Job, on_report: Callable[[Run], None] | None = None) -> None:
        self.job = job
        # A plain flag, not an Event: one is made per claimed job, and a flag
        # written by one thread and read by another needs no lock in CPython.
        self._cancel = False
        self._lock = threading.Lock()
        # The last progress reported, and whether it is written yet (an
        # attribute, not a property: the worker reads it for every held job
        # every round).
        self._progress: dict[str, Any] | None = None
        self.progress_pending = False
        # The first write is due a second after the run began, like every
        # later one: a job that ends sooner writes no progress of its own
        # (an ack deletes the row; any other outcome writes the last value).
        self.progress_written_at = time.monotonic()
        # Called (in the reporting thread) when a report finds nothing unwritten:
        # once per write at most, so the writer can sleep until there is something.
        self.on_report = on_report

    # --- cancel -------------------------------------------------------------------------

    @property
    def cancel_requested(self) -> bool:
        """True once ``Store.cancel_job`` asked this job to stop and the worker heard of it."""
        return self._cancel

    def request_cancel(self) -> None:
        """Mark the run asked to stop (the worker's side)."""
        self._cancel = True

    def raise_if_cancelled(self) -> None:
        """Raise ``Cancelled`` when a cancel was requested: the job then ends ``cancelled``."""
        if self._cancel:
            raise Cancelled(f"job {self.job.id} was cancelled while it ran")

    # --- progress -----------------------------------------------------------------------

    def progress(self, done: int, total: int | None = None, note: str | None = None) -> None:
        """Report how far the job has got: ``done`` of ``total`` (unknown: None), with a ``note``.

        Cheap to call in a tight loop: the worker writes the last value at
        most once a second (``PROGRESS_INTERVAL_S``), and always before the
        job's outcome. Raises ``InvalidArgument`` on a bad value.
        """
        value = _checked_progress(done, total, note)
        with self._lock:
            self._progress = value
            was_dirty, self.progress_pending = self.progress_pending, True
        if not was_dirty and self.on_report is not None:
            self.on_report(self)

    def take_progress(self) -> dict[str, Any] | None:
        """Return the progress reported since the last take, or None (the writer's side)."""
        with self._lock:
            if not self.progress_pending:
                return None
            self.progress_pending = False
            self.progress_written_at = time.monotonic()
            return self._progress

    def untake_progress(self) -> None:
        """Mark the last value taken unwritten again: the statement carrying it failed."""
        with self._lock:
            self.progress_pending = True

    def progress_due(self, now: float) -> bool:
        """True when unwritten progress may be written now (a second after the last write)."""
        return self.progress_pending and now - self.progress_written_at >= PROGRESS_INTERVAL_S


def _checked_progress(done: object, total: object, note: object) -> dict[str, Any]:
    """Return the stored form of a progress report, refusing what cannot be stored."""
    if not isinstance(done, int) or isinstance(done, bool) or not 0 <= done < 2**63:
        raise InvalidArgument(f"Invalid progress done {done!r}: expected an integer of at least 0.")
    if total is not None and (
        not isinstance(total, int) or isinstance(total, bool) or not 0 <= total < 2**63
    ):
        raise InvalidArgument(
            f"Invalid progress total {total!r}: expected an integer of at least 0, or None."
        )
    if note is not None and (
        not isinstance(note, str) or len(note) > MAX_NOTE_LENGTH or "\x00" in note
    ):
        raise InvalidArgument(
            f"Invalid progress note {note!r}: expected a string of at most "
            f"{MAX_NOTE_LENGTH} characters without NUL, or None."
        )
    return {"done": done, "total": total, "note": note}
