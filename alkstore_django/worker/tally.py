"""The worker's tally: counts since start, the per-job log line, and the throughput counters.

The log line is written only once an outcome is durable; the per-minute
throughput rows (what the admin charts) are written at most once a second,
not once a job.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..error_text import loggable
from ..executor import Outcome, Settled
from ..records import Job
from ..throughput import record_throughput
from .instruments import Instruments

logger = logging.getLogger("alkstore_django.worker")

OUTCOME_FLUSH_INTERVAL_S = 1.0
# Logged at INFO; the rest at WARNING. Plain text, as ``record`` looks names up.
# A cancel was asked for by an operator: no warning.
_QUIET = frozenset(
    s.value for s in (Settled.ACKED, Settled.RETRIED, Settled.SNOOZED, Settled.CANCELLED)
)


@dataclass
class WorkerStats:
    """Counts since start, by ``Settled`` result, for logs, tests and benchmarks."""

    acked: int = 0
    retried: int = 0
    dead: int = 0
    lost: int = 0
    released: int = 0
    snoozed: int = 0
    cancelled: int = 0


_LINE_FORMAT = "job id=%s queue=%s outcome=%s attempts=%s duration_ms=%.1f%s"
_ACKED = Settled.ACKED
_ACKED_NAME = _ACKED.value


def _line_args(job: Job, name: str, outcome: Outcome) -> tuple[Any, ...]:
    """Return the arguments of ``_LINE_FORMAT`` for ``job`` settled as ``name``."""
    return (
        job.id,
        job.queue,
        name,
        job.attempts,
        outcome.duration_ms,
        f" error={loggable(outcome.error)!r}" if outcome.error else "",
    )


class Tally:
    """Count and log settled outcomes; write the throughput counters to ``using`` in batches."""

    def __init__(self, using: str, instruments: Instruments | None = None) -> None:
        self.using = using
        self.instruments = instruments or Instruments()
        self.stats = WorkerStats()
        self._counts: Counter[tuple[str, str]] = Counter()
        self._last_flush = time.monotonic()
        # The INFO lines of a batch being reported (``batched``), or None.
        self._lines: list[str] | None = None
        self._sink: Any = None

    def record(self, job: Job, outcome: Outcome, result: Settled) -> None:
        """Count and log one settled outcome: acked, retried, snoozed, dead, cancelled or lost."""
        # The member's plain text: the attribute, counter and set lookups below
        # take their fast path on an exact str, on every job.
        name = result._value_
        self.instruments.outcome(job.queue, name, outcome.duration_ms)
        setattr(self.stats, name, getattr(self.stats, name) + 1)
        self._counts[(job.queue, name)] += 1
        level = logging.INFO if name in _QUIET else logging.WARNING
        if not logger.isEnabledFor(level):
            return
        args = _line_args(job, name, outcome)
        lines = self._lines
        if lines is not None:
            if level == logging.INFO:
                lines.append(_LINE_FORMAT % args)
                return
            self._write_lines()  # the batch's earlier lines first: the log keeps their order
        # The record is made here, not by ``logger.log``: its caller is known
        # (this method), so the stack walk that finds it is skipped, a fifth
        # of the line's cost. Handlers and filters see the same record.
        logger.handle(
            logger.makeRecord(
                logger.name, level, __file__, _LINE, _LINE_FORMAT, args, None, "record"
            )
        )

    def record_acked(self, settled: list[tuple[Job, Outcome]]) -> None:
        """Count and log committed acks, as ``record`` would one by one, inside ``batched``.

        The per-job work that does not depend on the job is done once for
        the batch: with no metrics to feed and the lines going to the batch
        sink, each job is left its counter and its line.
        """
        lines = self._lines
        if lines is None or self.instruments.enabled:
            for job, outcome in settled:
                self.record(job, outcome, _ACKED)
            return
        self.stats.acked += len(settled)
        counts = self._counts
        for job, outcome in settled:
            counts[(job.queue, _ACKED_NAME)] += 1
            lines.append(_LINE_FORMAT % _line_args(job, _ACKED_NAME, outcome))

    @contextlib.contextmanager
    def batched(self) -> Iterator[None]:
        """Write the INFO lines recorded inside with one write, where that writes the same.

        Only when the one handler the worker's lines reach is the commands'
        own stderr handler (``management/service.py``) with no filter on the
        way: a site's handlers and filters get a record per job, as always.
        Outcomes are reported here only once durable, a batch at a time.
        """
        sink = _batch_sink(logger)
        if sink is None:
            yield
            return
        self._lines, self._sink = [], sink
        try:
            yield
        finally:
            self._write_lines()
            self._lines = self._sink = None

    def _write_lines(self) -> None:
        lines = self._lines
        if lines:
            self._lines = []
            self._sink.write_batch(logger.name, logging.INFO, lines)

    def released(self, job: Job, result: Settled) -> None:
        """Count and log a job given back unstarted (a release the database refused: nothing)."""
        if result != Settled.RELEASED:
            return
        self.stats.released += 1
        # The attempt the claim took was given back with the job.
        logger.info(
            "job id=%s queue=%s outcome=released attempts=%s", job.id, job.queue, job.attempts - 1
        )

    def flush_due(self) -> bool:
        """True when the last flush is older than ``OUTCOME_FLUSH_INTERVAL_S``."""
        return time.monotonic() - self._last_flush >= OUTCOME_FLUSH_INTERVAL_S

    def flush(self) -> None:
        """Add the counts since the last flush to the per-minute throughput rows."""
        self._last_flush = time.monotonic()
        if not self._counts:
            return
        counts: dict[str, tuple[int, int, int]] = {}
        for (queue, result), n in self._counts.items():
            acked, retried, dead = counts.get(queue, (0, 0, 0))
            if result == Settled.ACKED:
                acked += n
            elif result == Settled.RETRIED:
                retried += n
            elif result == Settled.DEAD:
                dead += n
            counts[queue] = (acked, retried, dead)
        self._counts.clear()
        record_throughput(self.using, counts)


def _batch_sink(log: logging.Logger) -> Any:
    """Return the handler ``log``'s INFO records reach if it is the only one and writes batches.

    None when a filter, another handler, or no handler is on the way, or when
    INFO is below ``log``'s level.
    """
    if not log.isEnabledFor(logging.INFO):
        return None
    found = None
    current: logging.Logger | None = log
    while current is not None:
        if current.filters:
            return None
        for handler in current.handlers:
            if (
                found is not None
                or handler.filters
                or handler.level > logging.INFO
                or not hasattr(handler, "write_batch")
            ):
                return None
            found = handler
        current = current.parent if current.propagate else None
    return found


# The line a job's log record names as its origin (``Tally.record``).
_LINE = Tally.record.__code__.co_firstlineno
