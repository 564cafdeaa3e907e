"""The worker's tally: counts since start, the per-job log line, and the per-minute outcome rows.

The log line is written only once an outcome is durable; the per-minute rows
(what the admin charts) are written at most once a second, not once a job.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass

from ..error_text import loggable
from ..executor import Outcome
from ..records import Job
from ..throughput import record_outcomes
from .instruments import Instruments

logger = logging.getLogger("alkstore_django.worker")

OUTCOME_FLUSH_INTERVAL_S = 1.0


@dataclass
class WorkerStats:
    """Counts since start, for logs, tests and benchmarks."""

    acked: int = 0
    retried: int = 0
    dead: int = 0
    lost: int = 0
    released: int = 0
    snoozed: int = 0


class Tally:
    """Count and log settled outcomes; write the per-minute counts to ``using`` in batches."""

    def __init__(self, using: str, instruments: Instruments | None = None) -> None:
        self.using = using
        self.instruments = instruments or Instruments()
        self.stats = WorkerStats()
        self._counts: Counter[tuple[str, str]] = Counter()
        self._last_flush = time.monotonic()

    def record(self, job: Job, outcome: Outcome, result: str) -> None:
        """Count and log one settled outcome: acked, retried, snoozed, dead or lost."""
        self.instruments.outcome(job.queue, result, outcome.duration_ms)
        setattr(self.stats, result, getattr(self.stats, result) + 1)
        self._counts[(job.queue, result)] += 1
        level = logging.INFO if result in {"acked", "retried", "snoozed"} else logging.WARNING
        logger.log(
            level,
            "job id=%s queue=%s outcome=%s attempts=%s duration_ms=%.1f%s",
            job.id,
            job.queue,
            result,
            job.attempts,
            outcome.duration_ms,
            f" error={loggable(outcome.error)!r}" if outcome.error else "",
        )

    def flush_due(self) -> bool:
        return time.monotonic() - self._last_flush >= OUTCOME_FLUSH_INTERVAL_S

    def flush(self) -> None:
        """Add the counts since the last flush to the per-minute outcome rows."""
        self._last_flush = time.monotonic()
        if not self._counts:
            return
        counts: dict[str, tuple[int, int, int]] = {}
        for (queue, result), n in self._counts.items():
            acked, retried, dead = counts.get(queue, (0, 0, 0))
            if result == "acked":
                acked += n
            elif result == "retried":
                retried += n
            elif result == "dead":
                dead += n
            counts[queue] = (acked, retried, dead)
        self._counts.clear()
        record_outcomes(self.using, counts)
