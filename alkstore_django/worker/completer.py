"""The completer: what the handler threads hand back, settled on the worker's main thread.

Plain acks (a handler without hooks returned) wait in ``acks`` for the next
claim, which writes them in its own statement and commit; on their own they
are written within ``ACK_LINGER_S``. Every other outcome — a failure, a
snooze, a result written by a hook, a release of a job never started — goes
through ``executor.settle``, one transaction each, so a job whose outcome
cannot be recorded harms no other. The same path records the attempts the
worker decides itself: a run stopped at its time limit in the thread pool,
and a run the shutdown's grace period did not see end.
"""

from __future__ import annotations

import logging
import queue as queue_module
import time
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError

from ..error_text import timed_out
from ..errors import Cancelled, PayloadError, TimeLimitExceeded
from ..executor import (
    ACK,
    CONNECTION_ERRORS,
    Outcome,
    OutcomeKind,
    Settled,
    finished,
    has_hooks,
    settle,
    settles_alone,
)
from ..history import forget_acked
from ..results import encode_result, keep_acked
from ..signals import job_finished
from .cancels import cancelled_outcome, past_grace
from .holdings import Done, Held, Holdings
from .slots import TIMED_OUT

if TYPE_CHECKING:
    from ..records import Job
    from ..store import Store
    from .controls import Controls
    from .tally import Tally

logger = logging.getLogger("alkstore_django.worker")

# Finished jobs' acks wait for the next claim (one commit for both) at most
# this long before they are written on their own.
ACK_LINGER_S = 0.02
INTERRUPTED = (
    "interrupted: the worker shut down while the handler was still running "
    "(it outlived the {grace_s:g} s grace period)"
)
# Bound once: read per acked job.
ACKED, LOST = Settled.ACKED, Settled.LOST
# How long a thread asked to stop at its time limit has to stop before it is
# judged unstoppable (the raised time-out lands at its next bytecode).
STOP_WAIT_S = 1.0


def fences(acks: list[Done]) -> list[tuple[int, int]]:
    """Return the (id, generation) fences of finished jobs, as an ack statement takes them."""
    return [(d.held.handle.job.id, d.held.handle.job.generation) for d in acks]


class Completer:
    """Settle the ``Done`` jobs the handler threads put in ``done``, oldest first.

    Called from the worker's main thread only. A lost connection leaves the
    rest in line for the next round: nothing is dropped.
    """

    def __init__(
        self,
        worker_id: str,
        store: Store,
        holdings: Holdings,
        tally: Tally,
        controls: Controls,
        batch_at: int,
    ) -> None:
        self.worker_id = worker_id
        self.store = store
        self.holdings = holdings
        self.tally = tally
        self.controls = controls
        # As many waiting acks as make a batch worth its own statement.
        self.batch_at = batch_at
        self.done: queue_module.SimpleQueue[Done] = queue_module.SimpleQueue()
        self.acks: list[Done] = []
        self._acks_since = 0.0
        self._unsettled: deque[Done] = deque()

    def settle(self) -> bool:
        """Apply the finished jobs' outcomes; plain acks wait to ride the next claim.

        Returns whether any job came back: the loop claims after it, since a
        retry, a snooze or a release may be due again at once.
        """
        done_queue, unsettled = self.done, self._unsettled
        # This thread is the queue's one reader: what it saw is there to take.
        # Asked every round, mostly of an empty queue, where ``get_nowait``
        # raises and the loop catches ``Empty``, ten times the cost.
        while not done_queue.empty():
            unsettled.append(done_queue.get_nowait())
        returned = bool(unsettled)
        waiting = self.controls.await_finish
        kept: list[Done] = []
        while unsettled:
            done = unsettled[0]
            held = done.held
            if held.run.cancel_requested:
                # However a run asked to cancel ended, it ends cancelled: never a plain ack.
                done.outcome = cancelled_outcome(held, done.outcome)
            if waiting and held.handle.job.queue in waiting:
                # One of its running jobs finished here: its place may be free.
                self.controls.hold(held.handle.job.queue, None)
            if done.outcome.kind == ACK and not settles_alone(held.handler, held.handle.job):
                if not self.acks:
                    self._acks_since = time.monotonic()
                self.acks.append(done)
            elif done.outcome.kind == ACK and keeps_result_only(held):
                kept.append(done)
            elif held.stop_sent_at is not None:
                self.apply(held, stopped(held, done.outcome))
            else:
                self.apply(held, done.outcome)
            unsettled.popleft()
        if kept:
            self.ack_kept(kept)
        if self.tally.flush_due():
            self.tally.flush()
        return returned

    def apply(self, held: Held, outcome: Outcome, *, reuse_slot: bool = True) -> Settled:
        """Settle ``outcome`` for ``held`` (``executor.settle``), forget it, count it.

        Progress its handler reported and the worker has not written yet is
        written first, so a retried or snoozed row shows the last value (an
        acked job's row goes with its outcome: nothing would read it).
        """
        outcome = cancelled_outcome(held, outcome)
        if held.run.progress_pending and outcome.kind != ACK:
            self.holdings.write_progress(held)
        result = settle(held.handle, outcome, held.handler, self.store.using)
        if result == ACKED:
            self.forget_history([held.handle.job])
        self.holdings.forget(held, reuse_slot=reuse_slot)
        if outcome.kind == OutcomeKind.RELEASE:
            self.tally.released(held.handle.job, result)
        else:
            self.tally.record(held.handle.job, outcome, result)
        return result

    def ack_kept(self, kept: list[Done]) -> None:
        """Ack jobs that keep their result in one transaction: one ack statement, one insert.

        As ``executor.settle`` would one by one, but a round's worth at once,
        so keeping results costs a statement per batch rather than a
        transaction per job. A return value that is not JSON, or a batch that
        cannot be written for any reason but a lost connection, goes through
        ``settle`` one job at a time, which records why.
        """
        values: dict[int, Any] = {}
        alone: list[Done] = []
        for done in kept:
            try:
                values[id(done)] = encode_result(done.outcome.value)
            except PayloadError:
                alone.append(done)
        batch = [done for done in kept if id(done) in values]
        if batch:
            try:
                with self.store.dialect.atomic_write():
                    acked = set(self.store.dialect.ack_fenced(self.worker_id, fences(batch)))
                    keep_acked(
                        self.store,
                        [
                            (d.held.handle.job, values[id(d)])
                            for d in batch
                            if d.held.handle.job.id in acked
                        ],
                    )
            except CONNECTION_ERRORS:
                self._unsettled.extendleft(reversed(kept))
                raise
            except DatabaseError:
                logger.warning("kept results could not be written as a batch", exc_info=True)
                alone += batch
            else:
                self.report_acks(batch, acked)
        for n, done in enumerate(alone):
            try:
                self.apply(done.held, done.outcome)
            except CONNECTION_ERRORS:
                # Left in line, as the loop above leaves what it could not settle.
                self._unsettled.extendleft(reversed(alone[n:]))
                raise

    # --- plain acks -----------------------------------------------------------------

    def take_acks(self) -> list[Done]:
        """Hand the waiting acks to a claim; ``put_back`` them if it commits nothing."""
        acks, self.acks = self.acks, []
        return acks

    def put_back(self, acks: list[Done]) -> None:
        """Return acks a failed statement did not write, ahead of newer ones."""
        self.acks = acks + self.acks

    def flush_acks(self, force: bool = False) -> None:
        """Write the waiting acks on their own when no claim is coming to carry them."""
        if not self.acks:
            return
        if not force and (
            len(self.acks) < self.batch_at and time.monotonic() - self._acks_since < ACK_LINGER_S
        ):
            return
        acks = self.take_acks()
        try:
            acked = set(self.store.dialect.ack_fenced(self.worker_id, fences(acks)))
        except BaseException:
            self.put_back(acks)
            raise
        self.report_acks(acks, acked)

    def report_acks(self, acks: list[Done], acked: set[int]) -> None:
        """Log committed acks (only once they are durable) and free their slots."""
        forget, tally = self.holdings.forget, self.tally
        settled: list[tuple[Job, Outcome]] = []  # the acked jobs, counted and logged
        pending: list[tuple[Job, Outcome]] = []  # acked jobs not counted and logged yet
        with tally.batched():
            for done in acks:
                handle = done.held.handle
                handle.mark_spent()
                forget(done.held)
                if handle.job.id in acked:
                    pending.append((handle.job, done.outcome))
                    continue
                # A lost claim's line keeps its place: the acks before it go first.
                tally.record_acked(pending)
                settled += pending
                pending = []
                tally.record(handle.job, done.outcome, LOST)
            tally.record_acked(pending)
        settled += pending
        if job_finished.receivers:
            for done in acks:
                job = done.held.handle.job
                finished(job, done.outcome, ACKED if job.id in acked else LOST)
        self.forget_history(job for job, _ in settled)

    # --- retention: the attempt history of acked jobs (docs/scale.md) -----------------

    def forget_history(self, jobs: Iterable[Job]) -> None:
        """Delete the attempt history of committed acks whose job had failed before.

        One statement for a batch's such jobs, none when there are none (a
        job that never failed has no history). A failure here loses nothing:
        the leader's orphan sweep deletes those rows later.
        """
        try:
            forget_acked(self.store.using, jobs)
        except DatabaseError:
            logger.warning("could not delete acked jobs' attempt history", exc_info=True)

    # --- attempts the worker decides ---------------------------------------------------

    def stop_overdue_runs(self) -> bool:
        """Thread and asyncio pools: stop each run past its time limit; True once one did not stop.

        The time-out is raised inside the handler's thread (``ThreadLane.stop``);
        the attempt is recorded when the thread hands the run back, so the job
        is due again only once its run has ended. A run that has not stopped
        within ``STOP_WAIT_S`` keeps its claim, renewed, so that nobody runs
        its job until this worker has exited: the worker stops claiming and
        exits (75) after its grace period, and its sentinel then records the
        attempt as timed out (the slot says so). A superseded claim's run is
        stopped too, at once: its job's new claim must not run beside it.
        """
        now = time.monotonic()
        overdue = self.holdings.past_time_limit(now)
        if not overdue:
            return False
        # Runs handed back, waiting to be written, have ended.
        ended = {id(d.held) for d in (*self.acks, *self._unsettled)}
        stuck = False
        for held in overdue:
            if id(held) in ended or held.stuck or held.detached:
                continue
            if held.stop_sent_at is None:
                held.stop_sent_at = now
                self._send_stop(held)
            elif not held.superseded and now - held.stop_sent_at >= STOP_WAIT_S:
                held.stuck = stuck = True
                self.holdings.slots.mark(held.slot, TIMED_OUT)
                logger.error(
                    "handler stopped id=%s queue=%s (%s) and its thread did not stop: "
                    "the job stays claimed until this worker exits, which it does after its "
                    "grace period; use --pool processes for hard limits",
                    held.handle.job.id,
                    held.handle.job.queue,
                    _why_stopped(held, held.stop_sent_at),
                )
        return stuck

    def stop_superseded_runs(self) -> None:
        """Process pool: end each run of a claim taken again, or asked to cancel past its grace."""
        now = time.monotonic()
        for held in self.holdings.past_time_limit(now):
            if (held.superseded or past_grace(held, now)) and held.stop_sent_at is None:
                held.stop_sent_at = now
                self._send_stop(held)

    def _send_stop(self, held: Held) -> None:
        job = held.handle.job
        logger.warning(
            "stopping handler id=%s queue=%s attempts=%s: %s",
            job.id,
            job.queue,
            job.attempts,
            _why_stopped(held, held.stop_sent_at),
        )
        if held.lane is not None:
            # A run past its cancel grace ends cancelled; any other stop is a time-out.
            cancelled = not held.superseded and past_grace(held, time.monotonic())
            held.lane.stop(held.slot, Cancelled if cancelled else TimeLimitExceeded)

    def release(self, held: Held) -> None:
        """Give back a job that never started, its attempt with it (at shutdown)."""
        try:
            self.apply(held, Outcome(OutcomeKind.RELEASE))
        except DatabaseError:
            logger.warning("could not release id=%s; its claim will lapse", held.handle.job.id)

    def interrupt_running(self, grace_s: float) -> None:
        """Record the attempt of every job still running as interrupted.

        Releasing it would let another worker start it at the same attempt
        while this handler still runs; leaving the claim to lapse would hide
        why it ran again. Finished jobs whose outcome could not be written are
        left to lapse (their handles' outcomes are unknown to the database).
        """
        ended = {id(d.held) for d in [*self.acks, *self._unsettled]}
        interrupted = Outcome(OutcomeKind.RETRY, error=INTERRUPTED.format(grace_s=grace_s))
        for held in self.holdings:
            # A thread that did not stop at its time limit: its sentinel records
            # the attempt once this process has gone. A superseded claim is void.
            if id(held) not in ended and not held.stuck and not held.superseded:
                self.apply(held, interrupted)


def _why_stopped(held: Held, at: float | None) -> str:
    """Return why the worker stops ``held``'s run (at ``at``, monotonic), for its log lines."""
    job = held.handle.job
    if held.superseded:
        return "its claim lapsed and this worker claimed the job again"
    if at is not None and past_grace(held, at):
        grace_s = held.handle.queue.options.cancel_grace_s
        return f"it ran on {grace_s:g} s past its cancel request"
    return f"it passed its time limit ({job.timeout_s:g} s)"


def keeps_result_only(held: Held) -> bool:
    """True for a finished job whose ack writes its result and nothing else (no hook, no step)."""
    job = held.handle.job
    return (
        job.keep_result_s is not None
        and job.workflow_id is None
        and held.stop_sent_at is None
        and not has_hooks(held.handler)
    )


def stopped(held: Held, outcome: Outcome) -> Outcome:
    """Return the outcome of a run asked to stop: timed out if the raised time-out ended it."""
    limit = held.handle.job.timeout_s
    if (
        outcome.kind == OutcomeKind.CANCEL
        or held.superseded
        or limit is None
        or not isinstance(outcome.exc, TimeLimitExceeded)
    ):
        return outcome
    return Outcome(
        OutcomeKind.RETRY,
        error=timed_out(limit),
        exc=outcome.exc,
        exc_class=outcome.exc_class,
        traceback=outcome.traceback,
        duration_ms=outcome.duration_ms,
    )
