"""The completer: what the handler threads hand back, settled on the worker's main thread.

Plain acks (a handler without hooks returned) wait in ``acks`` for the next
claim, which writes them in its own statement and commit; on their own they
are written within ``ACK_LINGER_S``. Every other outcome — a failure, a
snooze, a result written by a hook, a release of a job never started — goes
through ``executor.settle``, one transaction each, so a job whose outcome
cannot be recorded harms no other. The same path records the attempts the
worker decides itself: a run past its time limit in the thread pool, and a
run the shutdown's grace period did not see end.
"""

from __future__ import annotations

import logging
import queue as queue_module
import time
from collections import deque
from typing import TYPE_CHECKING

from django.db import DatabaseError

from ..error_text import timed_out
from ..executor import ACK, Outcome, OutcomeKind, Settled, finished, has_hooks, settle
from .holdings import Done, Held, Holdings

if TYPE_CHECKING:
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

    def settle(self) -> None:
        """Apply the finished jobs' outcomes; plain acks wait to ride the next claim."""
        done_queue, unsettled = self.done, self._unsettled
        while True:
            try:
                unsettled.append(done_queue.get_nowait())
            except queue_module.Empty:
                break
        waiting = self.controls.await_finish
        while unsettled:
            done = unsettled[0]
            held = done.held
            if waiting and held.handle.job.queue in waiting:
                # One of its running jobs finished here: its place may be free.
                self.controls.hold(held.handle.job.queue, None)
            if done.outcome.kind == ACK and not has_hooks(held.handler):
                if not self.acks:
                    self._acks_since = time.monotonic()
                self.acks.append(done)
            else:
                self.apply(held, done.outcome)
            unsettled.popleft()
        if self.tally.flush_due():
            self.tally.flush()

    def apply(self, held: Held, outcome: Outcome, *, reuse_slot: bool = True) -> Settled:
        """Settle ``outcome`` for ``held`` (``executor.settle``), forget it, count it."""
        result = settle(held.handle, outcome, held.handler, self.store.using)
        self.holdings.forget(held, reuse_slot=reuse_slot)
        if outcome.kind == OutcomeKind.RELEASE:
            self.tally.released(held.handle.job, result)
        else:
            self.tally.record(held.handle.job, outcome, result)
        return result

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
        forget, record = self.holdings.forget, self.tally.record
        for done in acks:
            handle = done.held.handle
            handle.mark_spent()
            forget(done.held)
            result = ACKED if handle.job.id in acked else LOST
            record(handle.job, done.outcome, result)
            finished(handle.job, done.outcome, result)

    # --- attempts the worker decides ---------------------------------------------------

    def fail_overdue_runs(self, grace_s: float) -> bool:
        """Thread pool: fail each run past its time limit; True when there was one.

        Python cannot stop the thread, so the attempt is recorded (retried
        with backoff, or dead-lettered), its claim is no longer renewed, and
        the worker stops claiming and exits after its grace period for its
        supervisor to restart it, as gunicorn does with a stuck worker.
        """
        overdue = self.holdings.past_time_limit(time.monotonic())
        for held in overdue:
            limit = held.handle.job.timeout_s
            assert limit is not None
            self.apply(held, Outcome(OutcomeKind.RETRY, error=timed_out(limit)), reuse_slot=False)
            logger.error(
                "handler timed out id=%s queue=%s after %gs: a thread cannot be stopped, so "
                "this worker stops claiming and exits after its grace period (%gs); use "
                "--pool processes for hard limits",
                held.handle.job.id,
                held.handle.job.queue,
                limit,
                grace_s,
            )
        return bool(overdue)

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
        ended = {d.held.handle.job.id for d in [*self.acks, *self._unsettled]}
        interrupted = Outcome(OutcomeKind.RETRY, error=INTERRUPTED.format(grace_s=grace_s))
        for held in self.holdings:
            if held.handle.job.id not in ended:
                self.apply(held, interrupted)
