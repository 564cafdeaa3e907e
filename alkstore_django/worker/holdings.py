"""The jobs a worker holds under claim: by claim, their slots, and when each claim is renewed.

The worker's main thread alone reads and changes this; handler threads only
receive a ``Held`` to run and hand back a ``Done``.

A claim is a job id and a generation. A worker stalled past its claims (a
SIGSTOP, a long pause, a database outage) can claim its own lapsed jobs
again: the new claim then supersedes the one still held. The superseded
claim keeps its slot until its thread hands it back, is never started if it
has not been, and every outcome of it is refused without a statement.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..executor import Outcome
from ..queues.handles import JobHandle
from ..runs import PROGRESS_INTERVAL_S, Run
from .slots import ClaimSlots

logger = logging.getLogger("alkstore_django.worker")

# A claim is renewed when a third of its visibility timeout has passed, so two
# renewals can fail before a running job could be handed to another worker.
HEARTBEAT_FRACTION = 1 / 3


@dataclass(slots=True)
class Held:
    """A job this worker holds a claim on, running or waiting for a thread.

    One is made per claimed job: slots make it, and the reads of it, cheaper.
    """

    handle: JobHandle
    handler: Any
    next_heartbeat_at: float
    slot: int
    # What the handler sees as ``current_run()``: its cancel flag and its progress.
    run: Run
    # When its handler started (monotonic); None while it waits for a slot.
    started_at: float | None = None
    # The lane running it (set by its handler thread), to stop it at its time limit.
    lane: Any = None
    # This worker claimed the job again after this claim lapsed.
    superseded: bool = False
    # When its thread was asked to stop at its time limit; True once it did not.
    stop_sent_at: float | None = None
    stuck: bool = False
    # Its coroutine ignored the stop (asyncio pool): its outcome was handed back
    # as the stop meant and its slot reused, while it runs on.
    detached: bool = False
    # When its run, asked to cancel, is stopped if it has not ended (monotonic).
    cancel_by: float | None = None


@dataclass(slots=True)
class Done:
    """A held job whose handler has run, and what it decided (one per job, as ``Held``)."""

    held: Held
    outcome: Outcome


class Holdings:
    """Up to ``capacity`` held jobs; ``slots`` mirrors them for the worker's sentinel."""

    def __init__(self, capacity: int) -> None:
        self.slots = ClaimSlots(capacity)
        # The current claim of each job by id; superseded claims by (id, generation).
        self._held: dict[int, Held] = {}
        self._superseded: dict[tuple[int, int], Held] = {}
        # When the soonest claim needs renewing, or progress writing (monotonic).
        self.next_beat = float("inf")
        # Set by a handler's first unwritten report (``Run.on_report``): the
        # main thread then looks for progress to write, woken by ``wake``.
        self.reported = False
        self.wake: threading.Event | None = None
        self._on_report = self._progress_reported  # bound once, not once a job

    def __len__(self) -> int:
        return len(self._held) + len(self._superseded)

    def __iter__(self) -> Iterator[Held]:
        """Iterate over a snapshot: the caller may forget jobs meanwhile."""
        return iter([*self._held.values(), *self._superseded.values()])

    def add(self, handle: JobHandle, handler: Any, now: float) -> Held:
        """Hold a newly claimed job; its claim is renewed a third of its timeout from ``now``."""
        job = handle.job
        beat_at = now + job.visibility_timeout_s * HEARTBEAT_FRACTION
        slot = self.slots.take(job.id, job.generation)
        held = Held(
            handle=handle,
            handler=handler,
            next_heartbeat_at=beat_at,
            slot=slot,
            run=Run(job, self._on_report),
        )
        self.next_beat = min(self.next_beat, beat_at)
        earlier = self._held.setdefault(job.id, held)
        if earlier is not held:
            self._supersede(earlier, held)
        return held

    def _supersede(self, earlier: Held, held: Held) -> None:
        """Hold ``held``, a new claim of a job whose ``earlier`` claim lapsed in this worker."""
        job = earlier.handle.job
        earlier.superseded = True
        # Its outcomes are refused without a statement; its thread skips it if not started.
        earlier.handle.mark_spent()
        self._superseded[(job.id, job.generation)] = earlier
        self._held[job.id] = held
        logger.warning(
            "claim lost id=%s queue=%s attempts=%s: it lapsed and this worker claimed it "
            "again (attempts=%s); the lapsed claim is %s",
            job.id,
            job.queue,
            job.attempts,
            held.handle.job.attempts,
            "not run" if earlier.started_at is None else "refused when its run ends",
        )

    def forget(self, held: Held, *, reuse_slot: bool = True) -> None:
        """Drop a held job whose outcome is durable (or whose claim is gone).

        The slot of a run abandoned in a stuck thread is not reused: that
        thread may still mark it when (if) its handler returns.
        """
        job = held.handle.job
        if held.superseded:
            if self._superseded.pop((job.id, job.generation), None) is None:
                return
        elif self._held.pop(job.id, None) is None:
            return
        if reuse_slot:
            self.slots.free(held.slot)

    def _progress_reported(self, run: Run) -> None:
        """A handler's thread reported progress with none unwritten: wake the main thread."""
        self.reported = True
        if self.wake is not None:
            self.wake.set()

    def renew_due(self) -> None:
        """Renew every claim whose time has come; stop renewing one that was lost.

        A run whose progress is due (``PROGRESS_INTERVAL_S`` after its last
        write) has its claim renewed early to carry it: one statement renews
        the claim and writes the progress, at most once a second per job.
        """
        now = time.monotonic()
        self.next_beat = float("inf")
        # Cleared before the runs are read: a report after this is seen next time.
        self.reported = False
        for held in self:
            if held.handle.spent or held.next_heartbeat_at == float("inf"):
                continue  # settled, or its claim is lost: nothing to renew or write
            run = held.run
            beat_at = held.next_heartbeat_at
            if run.progress_pending:
                # Unwritten progress is due a second after the last write.
                beat_at = min(beat_at, run.progress_written_at + PROGRESS_INTERVAL_S)
            if beat_at > now:
                self.next_beat = min(self.next_beat, beat_at)
                continue
            vt = held.handle.job.visibility_timeout_s
            held.next_heartbeat_at = now + vt * HEARTBEAT_FRACTION
            progress = run.take_progress() if run.progress_due(now) else None
            renewed = self._renew(held, progress)
            if not renewed:
                logger.warning(
                    "claim lost id=%s queue=%s attempts=%s: another worker may run it",
                    held.handle.job.id,
                    held.handle.job.queue,
                    held.handle.job.attempts,
                )
                # Stop renewing; the handler's outcome will be logged as lost.
                held.next_heartbeat_at = float("inf")
            self.next_beat = min(self.next_beat, held.next_heartbeat_at)

    def write_progress(self, held: Held) -> None:
        """Write the run's unwritten progress now, fenced, before its outcome is applied.

        Its outcome follows at once, so the one-a-second throttle does not
        apply: the last value a handler reported is the one left readable.
        """
        progress = held.run.take_progress()
        if progress is not None and not held.handle.spent:
            self._renew(held, progress)

    @staticmethod
    def _renew(held: Held, progress: dict[str, Any] | None) -> bool:
        """Renew ``held``'s claim, writing ``progress`` with it; False once the claim is lost.

        A statement that fails leaves the progress unwritten, for the next try.
        """
        try:
            return held.handle.heartbeat(held.handle.job.visibility_timeout_s, progress)
        except BaseException:
            if progress is not None:
                held.run.untake_progress()
            raise

    def past_time_limit(self, now: float) -> list[Held]:
        """Return the started jobs whose run has passed its ``timeout_s``, or whose claim lapsed.

        A superseded claim that started is included at once: its run must
        not go on beside the job's new claim. So is a run asked to cancel
        that is still going past its grace (``cancel_by``).
        """
        return [
            held
            for held in self
            if held.started_at is not None
            and (
                held.superseded
                or (held.cancel_by is not None and now >= held.cancel_by)
                or (
                    held.handle.job.timeout_s is not None
                    and now - held.started_at >= held.handle.job.timeout_s
                )
            )
        ]
