"""The worker: claim in batches, run handlers on threads, settle outcomes in batches.

One main thread owns the worker's own database traffic (claims, acks,
heartbeats, sweeps) on one persistent connection, whatever ``CONN_MAX_AGE``
says: a site on Django's default of 0 must not pay a connection per job.
Handler threads call ``close_old_connections()`` around each job, as a
request would, so user code sees the site's usual connection policy.
"""

from __future__ import annotations

import logging
import os
import queue as queue_module
import socket
import threading
import time
import uuid
from collections.abc import Sequence

from django.db import DatabaseError, connections, transaction

from .conf import app_settings
from .errors import InvalidArgument
from .handlers import OUTBOX_PREFIX, HandlerRegistry, registry
from .job_runs import Held, Outcome, run_held, tidy_connections
from .notify import Watcher, open_watcher
from .queues import JobHandle, Queue
from .store import Store, get_store
from .tally import Tally, WorkerStats
from .validation import validate_worker_id

logger = logging.getLogger(__name__)

# A claim is renewed when a third of its visibility timeout has passed, so two
# renewals can fail before a running job could be handed to another worker.
HEARTBEAT_FRACTION = 1 / 3
# Finished jobs' acks wait for the next claim (one commit for both) at most
# this long before they are written on their own.
ACK_LINGER_S = 0.02
# Jobs held under claim per handler thread when --batch is not given: enough
# that a claim round trip overlaps with running what is already held.
DEFAULT_PREFETCH = 8
DB_RETRY_MAX_S = 5.0
STOP_CHECK_S = 0.25


def default_worker_id() -> str:
    """Return an id unique to this process: host, pid and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Worker:
    """Run the handlers of ``queues`` until ``stop`` is set (or, in burst mode, until idle).

    ``batch`` is the most jobs held under claim at once (running plus waiting
    for a thread). On stop, jobs not yet started are released at once; running
    ones get ``grace_s`` to finish, then their claims are released too, giving
    back the attempt (the job did not fail).
    """

    def __init__(
        self,
        queues: Sequence[str] | None = None,
        *,
        store: Store | None = None,
        concurrency: int = 4,
        batch: int | None = None,
        worker_id: str | None = None,
        burst: bool = False,
        grace_s: float = 30.0,
        poll_interval_s: float | None = None,
        sweep_interval_s: float | None = None,
        handlers: HandlerRegistry | None = None,
    ) -> None:
        self.store = store or get_store()
        self.handlers = handlers or registry
        names = list(queues) if queues else self.handlers.queues()
        self.queue_names = names
        self.concurrency = max(1, concurrency)
        self.capacity = max(self.concurrency, batch or self.concurrency * DEFAULT_PREFETCH)
        # Refill once a quarter of the capacity is free: claims come in batches
        # while the rest of what is held keeps the threads busy.
        self._refill_at = max(1, self.capacity // 4)
        # Checked here: the worker's claims skip the per-call validation of claim_batch,
        # and an id the column cannot hold would fail every claim, forever.
        self.worker_id = default_worker_id() if worker_id is None else validate_worker_id(worker_id)
        self.burst = burst
        self.grace_s = grace_s
        self.poll_interval_s = poll_interval_s or app_settings.poll_interval_s
        self.sweep_interval_s = sweep_interval_s or app_settings.sweep_interval_s
        self.tally = Tally(self.store.using)
        self._queues: list[Queue] = []
        self._held: dict[int, Held] = {}
        self._work: queue_module.SimpleQueue[Held | None] = queue_module.SimpleQueue()
        self._done: queue_module.SimpleQueue[Outcome] = queue_module.SimpleQueue()
        self._unsettled: list[Outcome] = []
        self._acks: list[Outcome] = []
        self._acks_since = 0.0
        self._next_beat = float("inf")
        self._wake = threading.Event()
        self._halt = threading.Event()
        self._threads: list[threading.Thread] = []
        self._rr = 0
        self._db_failures = 0

    @property
    def stats(self) -> WorkerStats:
        """Counts since start (the tally's)."""
        return self.tally.stats

    # --- set-up -----------------------------------------------------------------

    def _build_queues(self) -> list[Queue]:
        built = []
        for name in self.queue_names:
            if self.handlers.get(name) is None:
                raise InvalidArgument(
                    f"No handler registered for queue {name!r}: expected one of "
                    f"{', '.join(map(repr, self.handlers.queues())) or 'none (add a jobs.py)'}."
                )
            if name.startswith(OUTBOX_PREFIX):
                built.append(self.store.outbox(name[len(OUTBOX_PREFIX) :]).queue)
            else:
                built.append(self.store.queue(name))
        return built

    def _start_threads(self) -> None:
        for index in range(self.concurrency):
            thread = threading.Thread(
                target=self._run_jobs, name=f"alkstore-job-{index}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
        watcher = threading.Thread(target=self._watch, name="alkstore-watch", daemon=True)
        watcher.start()
        self._threads.append(watcher)

    # --- the loop -----------------------------------------------------------------

    def run(self, stop: threading.Event) -> WorkerStats:
        """Work until ``stop`` is set; return the counts."""
        self._queues = self._build_queues()
        logger.info(
            "worker started worker_id=%s queues=%s concurrency=%d batch=%d",
            self.worker_id,
            ",".join(self.queue_names),
            self.concurrency,
            self.capacity,
        )
        self._start_threads()
        next_sweep = time.monotonic()
        try:
            while not stop.is_set():
                self._wake.clear()
                try:
                    self._settle()
                    if time.monotonic() >= self._next_beat:
                        self._heartbeat()
                    if time.monotonic() >= next_sweep:
                        self._sweep()
                        next_sweep = time.monotonic() + self.sweep_interval_s
                    claimed, drained = self._fill()
                    self._flush_acks(force=drained)
                    if claimed and not drained:
                        continue
                    if self.burst and drained and not self._held:
                        break
                    timeout = self._idle_timeout(drained)
                    self._db_failures = 0
                except DatabaseError as exc:
                    self._database_down(exc)
                    continue
                # Sliced so a stop request is seen within STOP_CHECK_S.
                self._wake.wait(min(timeout, STOP_CHECK_S))
        finally:
            self._shutdown()
        return self.stats

    def _idle_timeout(self, drained: bool) -> float:
        timeout = min(self.poll_interval_s, max(self._next_beat - time.monotonic(), 0.0))
        if self._acks:
            timeout = min(timeout, ACK_LINGER_S)
        if drained and len(self._held) < self.capacity:
            due = self.store.dialect.next_due_at([q.name for q in self._queues])
            if due is not None:
                timeout = min(timeout, due)
        return max(timeout, 0.0)

    def _fill(self) -> tuple[int, bool]:
        """Claim up to free capacity across the queues; return (claimed, all drained).

        The acks waiting in ``_acks`` ride the first claim: one statement and
        one commit settle the finished jobs and claim the next ones.
        """
        # Jobs whose ack is waiting are finished: their slots are free.
        free = self.capacity - len(self._held) + len(self._acks)
        # Claiming one job at a time would cost a round trip per job: wait for
        # a quarter of the capacity to free up unless the worker is idle.
        if free <= 0 or (len(self._held) > len(self._acks) and free < self._refill_at):
            return 0, False
        claimed = 0
        drained = True
        count = len(self._queues)
        dialect = self.store.dialect
        for offset in range(count):
            q = self._queues[(self._rr + offset) % count]
            want = self.capacity - len(self._held) + len(self._acks)
            if want <= 0:
                drained = False
                break
            acks, self._acks = self._acks, []
            fences = [(o.held.handle.job.id, o.held.handle.job.generation) for o in acks]
            try:
                acked, jobs = dialect.claim_and_ack(
                    q.name, self.worker_id, want, self.worker_id, fences
                )
            except BaseException:
                # Nothing was committed: the acks are tried again.
                self._acks = acks + self._acks
                raise
            if acks:
                self._report_acks(acks, set(acked))
            if len(jobs) == want:
                drained = False
            now = time.monotonic()
            func = self.handlers.get(q.name)
            for job in jobs:
                handle = JobHandle(q, job)
                beat_at = now + job.visibility_timeout_s * HEARTBEAT_FRACTION
                held = Held(handle=handle, handler=func, next_heartbeat_at=beat_at)  # type: ignore[arg-type]
                self._next_beat = min(self._next_beat, beat_at)
                self._held[job.id] = held
                self._work.put(held)
            claimed += len(jobs)
        self._rr += 1
        return claimed, drained

    # --- handler threads ------------------------------------------------------------

    def _run_jobs(self) -> None:
        while True:
            held = self._work.get()
            if held is None:
                tidy_connections(connections.close_all)
                return
            self._done.put(run_held(held))
            # Wake the main thread when it has a batch to settle and claim, or
            # when this thread is about to go idle; not once per job.
            if self._work.empty() or self._done.qsize() >= self._refill_at:
                self._wake.set()

    def _watch(self) -> None:
        watcher: Watcher | None = None
        channels = [q.channel for q in self._queues]
        while not self._halt.is_set():
            try:
                if watcher is None:
                    watcher = open_watcher(self.store, channels, app_settings.listen_database)
                if watcher.wait(1.0):
                    self._wake.set()
            except Exception:
                logger.warning("wake-up watcher failed; relying on polling", exc_info=True)
                if watcher is not None:
                    watcher.close()
                watcher = None
                self._halt.wait(1.0)
        if watcher is not None:
            watcher.close()
        tidy_connections(connections.close_all)

    # --- settling outcomes -------------------------------------------------------------

    def _settle(self) -> None:
        while True:
            try:
                self._unsettled.append(self._done.get_nowait())
            except queue_module.Empty:
                break
        if self._unsettled:
            pending, self._unsettled = self._unsettled, []
            try:
                self._apply(pending)
            except BaseException:
                # Nothing is dropped: what was not applied is tried again.
                self._unsettled = pending + self._unsettled
                raise
        if self.tally.flush_due():
            self.tally.flush()

    def _apply(self, outcomes: list[Outcome]) -> None:
        # Plain acks wait for the next claim (see _fill); acks whose handler
        # writes a result, and failures, are applied here, each in its own
        # transaction with its hook.
        hooked = []
        for outcome in outcomes:
            if outcome.kind != "ack":
                self._apply_failure(outcome)
                self._held.pop(outcome.held.handle.job.id, None)
            elif hasattr(outcome.held.handler, "on_acked"):
                hooked.append(outcome)
            else:
                if not self._acks:
                    self._acks_since = time.monotonic()
                self._acks.append(outcome)
        if hooked:
            self._apply_hooked_acks(hooked)

    def _apply_hooked_acks(self, acks: list[Outcome]) -> None:
        dialect = self.store.dialect
        fences = [(o.held.handle.job.id, o.held.handle.job.generation) for o in acks]
        # Results are written in the ack's own transaction: never lost, never doubled.
        with transaction.atomic(using=self.store.using):
            acked = set(dialect.ack_fenced(self.worker_id, fences))
            for outcome in acks:
                if outcome.held.handle.job.id in acked:
                    outcome.held.handler.on_acked(outcome.held.handle.job, outcome.value)  # type: ignore[attr-defined]
        self._report_acks(acks, acked)

    def _flush_acks(self, force: bool = False) -> None:
        """Write the waiting acks on their own when no claim is coming to carry them."""
        if not self._acks:
            return
        if not force and (
            len(self._acks) < self._refill_at and time.monotonic() - self._acks_since < ACK_LINGER_S
        ):
            return
        acks, self._acks = self._acks, []
        fences = [(o.held.handle.job.id, o.held.handle.job.generation) for o in acks]
        try:
            acked = set(self.store.dialect.ack_fenced(self.worker_id, fences))
        except BaseException:
            self._acks = acks + self._acks
            raise
        self._report_acks(acks, acked)

    def _report_acks(self, acks: list[Outcome], acked: set[int]) -> None:
        """Log committed acks (only once they are durable) and free their slots."""
        held = self._held
        for outcome in acks:
            handle = outcome.held.handle
            handle.mark_spent()
            held.pop(handle.job.id, None)
            self.tally.record(outcome, "acked" if handle.job.id in acked else "lost")

    def _apply_failure(self, outcome: Outcome) -> None:
        handle = outcome.held.handle
        job = handle.job
        exhausted = outcome.kind == "fail" or job.attempts >= job.max_attempts
        hook = getattr(outcome.held.handler, "on_failed", None)
        with transaction.atomic(using=self.store.using):
            if outcome.kind == "fail":
                applied = handle.fail(outcome.error)
            else:
                applied = handle.retry(outcome.error)
            if applied and hook is not None:
                hook(job, outcome.exc, outcome.error, exhausted)
        if not applied:
            self.tally.record(outcome, "lost")
        else:
            self.tally.record(outcome, "dead" if exhausted else "retried")

    # --- keeping claims alive -------------------------------------------------------------

    def _heartbeat(self) -> None:
        now = time.monotonic()
        self._next_beat = float("inf")
        for held in list(self._held.values()):
            if held.handle.spent:
                continue
            if held.next_heartbeat_at > now:
                self._next_beat = min(self._next_beat, held.next_heartbeat_at)
                continue
            vt = held.handle.job.visibility_timeout_s
            held.next_heartbeat_at = now + vt * HEARTBEAT_FRACTION
            if not held.handle.heartbeat(vt):
                logger.warning(
                    "claim lost id=%s queue=%s attempts=%s: another worker may run it",
                    held.handle.job.id,
                    held.handle.job.queue,
                    held.handle.job.attempts,
                )
                # Stop renewing; the handler's outcome will be logged as lost.
                held.next_heartbeat_at = float("inf")
            self._next_beat = min(self._next_beat, held.next_heartbeat_at)

    def _sweep(self) -> None:
        for q in self._queues:
            result = q.sweep_expired()
            if result.expired or result.purged:
                logger.info(
                    "swept queue=%s expired=%d purged=%d", q.name, result.expired, result.purged
                )
        # A queue whose workers are gone would otherwise keep these processing forever.
        buried = self.store.dialect.bury_exhausted_lapsed()
        if buried:
            logger.warning("buried exhausted lapsed claims count=%d (any queue)", buried)

    def _database_down(self, exc: Exception) -> None:
        self._db_failures += 1
        delay = min(0.1 * 2**self._db_failures, DB_RETRY_MAX_S)
        logger.error(
            "database unavailable (attempt %d), retrying in %.1fs: %s",
            self._db_failures,
            delay,
            exc,
        )
        connections[self.store.using].close()
        self._halt.wait(delay)

    # --- stopping ---------------------------------------------------------------------------

    def _shutdown(self) -> None:
        # Jobs not started yet go back at once; running ones get the grace period.
        not_started = []
        while True:
            try:
                item = self._work.get_nowait()
            except queue_module.Empty:
                break
            if item is not None:
                not_started.append(item)
        for held in not_started:
            self._release(held)
        deadline = time.monotonic() + self.grace_s
        while self._held and time.monotonic() < deadline:
            try:
                self._settle()
                self._flush_acks(force=True)
                self._heartbeat()
            except DatabaseError as exc:
                self._database_down(exc)
            self._wake.wait(min(0.1, max(deadline - time.monotonic(), 0.0)))
            self._wake.clear()
        try:
            self._flush_acks(force=True)
        except DatabaseError:
            logger.warning("could not write the last acks; their claims will lapse", exc_info=True)
        finished = {o.held.handle.job.id for o in self._acks}
        for held in list(self._held.values()):
            # A finished job whose ack could not be written is not released
            # (that would run it again at once); its claim lapses instead.
            if held.handle.job.id not in finished:
                self._release(held)
        try:
            self.tally.flush()
        except DatabaseError:
            logger.warning("could not record outcome counts at shutdown", exc_info=True)
        self._halt.set()
        for _ in range(self.concurrency):
            self._work.put(None)
        # Handler threads still inside a job after the grace period are left
        # behind (they are daemons); the watcher answers within a second.
        for thread in self._threads:
            thread.join(0.1 if thread.name.startswith("alkstore-job") else 2.0)
        connections[self.store.using].close()
        logger.info(
            "worker stopped worker_id=%s acked=%d retried=%d dead=%d lost=%d released=%d",
            self.worker_id,
            self.stats.acked,
            self.stats.retried,
            self.stats.dead,
            self.stats.lost,
            self.stats.released,
        )

    def _release(self, held: Held) -> None:
        self._held.pop(held.handle.job.id, None)
        try:
            released = held.handle.release()
        except DatabaseError:
            logger.warning("could not release id=%s; its claim will lapse", held.handle.job.id)
            return
        if released:
            self.stats.released += 1
            logger.info(
                "job id=%s queue=%s outcome=released attempts=%s",
                held.handle.job.id,
                held.handle.job.queue,
                held.handle.job.attempts - 1,
            )
