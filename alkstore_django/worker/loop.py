"""The claim loop: claim in batches, hand held jobs to the pool's lanes, settle what returns.

One main thread owns the worker's own database traffic (claims, acks,
heartbeats, upkeep) on one persistent connection, whatever ``CONN_MAX_AGE``
says: a site on Django's default of 0 must not pay a connection per job.
Handler threads call ``close_old_connections()`` around each job, as a
request would, so user code sees the site's usual connection policy.

A claimed job passes through a few roles: ``holdings`` (held under claim,
its claim renewed), a lane of the pool (``threads``, ``aio``: where its
handler runs), the ``completer`` (its outcome settled, acks riding the
next claim) and the ``tally`` (counted and logged). ``controls`` gate the
claims, the ``cadence`` says when the next one is due, ``upkeep`` runs the
periodic chores.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Sequence

from django.db import DatabaseError, connections

from .. import presence
from ..conf import app_settings
from ..error_text import describe
from ..errors import InvalidArgument
from ..executor import CONNECTION_ERRORS
from ..handlers import HandlerRegistry, registry
from ..notify import QueueWatch
from ..queues import Queue
from ..store import Store, get_store
from ..validation import validate_worker_id
from .aio import AsyncioPool
from .cadence import Cadence
from .cancels import Cancels
from .children import KILL_GRACE_S
from .completer import Completer, fences
from .controls import Controls
from .holdings import Holdings
from .instruments import Instruments
from .pools import POOLS
from .serving import Pool
from .slots import Pulse
from .tally import Tally, WorkerStats
from .threads import ThreadPool
from .upkeep import Upkeep
from .wake import Wake
from .watcher import WatcherThread

logger = logging.getLogger("alkstore_django.worker")

# Jobs held under claim per handler thread when --batch is not given: enough
# that a claim round trip overlaps with running what is already held.
DEFAULT_PREFETCH = 8
DB_RETRY_MAX_S = 5.0
STOP_CHECK_S = 0.25
# How often the thread and asyncio pools look for runs past their time limit.
LIMIT_CHECK_S = 0.1
# The asyncio pool's slots are cheap and its runs mostly wait: twice as many
# held as run is enough to keep them all busy between claims.
ASYNCIO_PREFETCH = 2


def make_pool(worker: Worker) -> Pool:
    """Return the pool ``worker.pool`` names, over the worker's roles."""
    return AsyncioPool(worker) if worker.pool == "asyncio" else ThreadPool(worker)


def default_worker_id() -> str:
    """Return an id unique to this process: host, pid and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Worker:
    """Run the handlers of ``queues`` until ``stop`` is set (or, in burst mode, until idle).

    ``batch`` is the most jobs held under claim at once (running plus waiting
    for a thread). On stop, jobs not yet started are released at once (their
    attempt given back); running ones get ``grace_s`` to finish. A job still
    running after that is never handed back at the same attempt: its attempt
    is recorded as interrupted and it is retried with backoff, as the next
    attempt. ``holdings`` records what is held, in memory the worker's
    sentinel process reads if the worker dies (``sentinel.py``).

    ``pool`` is where handlers run: ``threads`` (the default),
    ``processes`` (one child process per concurrency slot, replaced after
    ``max_jobs_per_child`` jobs or past ``max_memory_per_child_mb``; see
    ``pools.py``) or ``asyncio`` (one event loop running up to
    ``concurrency`` handlers; see ``aio.py``). A run past its job's
    ``timeout_s`` fails that attempt with ``timed out after N s``: the
    process pool kills the child; the thread pool raises the time-out inside
    the handler's thread, the asyncio pool cancels the coroutine, and the
    attempt is recorded once the run has stopped. A thread that does not stop
    keeps its job claimed: the worker stops claiming and returns after
    ``grace_s`` with ``timed_out`` set, for its supervisor to restart the
    process. (A coroutine that ignores its cancellation is left to run on,
    its attempt recorded: ``aio.py``.)
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
        pool: str = "threads",
        max_jobs_per_child: int | None = None,
        max_memory_per_child_mb: float | None = None,
        instruments: Instruments | None = None,
    ) -> None:
        if pool not in POOLS:
            raise InvalidArgument(f"Invalid pool {pool!r}: expected one of {', '.join(POOLS)}.")
        self.store = store or get_store()
        self.handlers = handlers or registry
        # By default every registered queue whose jobs live on this worker's alias
        # (``runworker`` runs a Worker per alias: ``crew.py``).
        self.queue_names = list(queues) if queues else self._own_queues()
        self.concurrency = max(1, concurrency)
        prefetch = ASYNCIO_PREFETCH if pool == "asyncio" else DEFAULT_PREFETCH
        self.capacity = max(self.concurrency, batch or self.concurrency * prefetch)
        # Refill once a quarter of the capacity is free: claims come in batches
        # while the rest of what is held keeps the threads busy.
        self.refill_at = max(1, self.capacity // 4)
        # Checked here: the worker's claims skip the per-call validation of claim_batch,
        # and an id the column cannot hold would fail every claim, forever.
        self.worker_id = default_worker_id() if worker_id is None else validate_worker_id(worker_id)
        self.burst = burst
        self.grace_s = grace_s
        self.poll_interval_s = poll_interval_s or app_settings.poll_interval_s
        self.sweep_interval_s = sweep_interval_s or app_settings.sweep_interval_s
        self.pool = pool
        self.max_jobs_per_child = max_jobs_per_child
        self.max_memory_per_child_mb = max_memory_per_child_mb
        self.timed_out = False
        # Why the worker stopped on its own (a pool that cannot run jobs), if it did.
        self.broken: str | None = None
        # The roles a claimed job passes through, and the loop's periodic chores.
        self.tally = Tally(self.store.using, instruments)
        self.holdings = Holdings(self.capacity)
        # The loop's rounds, which the sentinel watches (its watchdog).
        self.pulse = Pulse()
        self.controls = Controls(self.queue_names, self.poll_interval_s)
        self.completer = Completer(
            self.worker_id, self.store, self.holdings, self.tally, self.controls, self.refill_at
        )
        self.upkeep = Upkeep(self)
        self.cancels = Cancels(self.store, self.holdings, self.poll_interval_s)
        self.queues: list[Queue] = []
        self.wake = Wake()
        # SQLite's and MariaDB's watch runs in a thread of its own (``_start_watch``).
        self._watcher: WatcherThread | None = None
        # A handler's progress report wakes the loop to write it (``Holdings.renew_due``).
        self.holdings.wake = self.wake
        self._halt = threading.Event()
        self.pool_lanes = make_pool(self)
        self._rr = 0
        self._db_failures = 0
        self._next_limit_check = 0.0
        self.cadence = Cadence(self)

    @property
    def stats(self) -> WorkerStats:
        """Counts since start (the tally's)."""
        return self.tally.stats

    # --- set-up -----------------------------------------------------------------

    def _own_queues(self) -> list[str]:
        using = self.store.using
        return [n for n in self.handlers.queues() if self.store.of_queue(n).using == using]

    def build_queues(self) -> list[Queue]:
        """Return a Queue for each name this worker runs; refuse a name without a handler.

        A queue routed to another alias is refused too: its claims, fences and
        settles belong to that alias's loop.
        """
        built = []
        for name in self.queue_names:
            if self.handlers.get(name) is None:
                raise InvalidArgument(
                    f"No handler registered for queue {name!r}: expected one of "
                    f"{', '.join(map(repr, self.handlers.queues())) or 'none (add a jobs.py)'}."
                )
            queue = self.store.handler_queue(name)
            if queue.store.using != self.store.using:
                raise InvalidArgument(
                    f"Queue {name!r} lives on database {queue.store.using!r}, not on this "
                    f"worker's {self.store.using!r}: give the Worker that store "
                    "(runworker runs one per database)."
                )
            built.append(queue)
        return built

    # --- the loop -----------------------------------------------------------------

    def run(self, stop: threading.Event) -> WorkerStats:
        """Work until ``stop`` is set; return the counts."""
        self.queues = self.build_queues()
        logger.info(
            "worker started worker_id=%s queues=%s concurrency=%d batch=%d",
            self.worker_id,
            ",".join(self.queue_names),
            self.concurrency,
            self.capacity,
        )
        self.pool_lanes.start()
        woken = True
        try:
            self._start_watch()
            # This thread's connection carries the worker's own statements only
            # (until _shutdown says otherwise).
            self.store.dialect.own_session()
            while not stop.is_set():
                # Set after the wait timed out: still a wake-up. Cleared only when
                # seen set, so a set landing after this look is kept for the next wait.
                if self.wake.is_set():
                    self.wake.clear()
                    woken = True
                self.pulse.beat()
                try:
                    timeout = self._round(woken)
                except DatabaseError as exc:
                    self._database_error(exc)
                    woken = True
                    continue
                except Exception as exc:
                    # A bug, not an outage: reported, and what is held is settled on the way out.
                    logger.error("worker loop failed, stopping", exc_info=exc)
                    self.broken = f"failed: {describe(exc)}"
                    break
                if timeout is None:
                    break
                if timeout:
                    # Sliced so a stop request is seen within STOP_CHECK_S; a
                    # slice that ends unwoken claims only if its claim is due.
                    woken = self.wake.wait(min(timeout, STOP_CHECK_S))
                else:
                    self.wake.wait(0)  # busy: only read what the watch's socket holds
                    woken = True
        finally:
            self._shutdown()
        return self.stats

    def _round(self, woken: bool) -> float | None:
        """Settle, renew, do the upkeep due, claim; return how long to wait (None: stop).

        Unless ``woken`` (or a job came back, or a queue was paused or
        resumed), a worker whose last claim drained its queues claims again
        only when its ``cadence`` says: the stop checks that end its wait
        every STOP_CHECK_S must not each cost an empty claim.
        """
        if self.completer.settle():
            woken = True  # a job came back: it may be due again at once
        if self.broken:
            return None
        if time.monotonic() >= self._next_limit_check:
            self._next_limit_check = time.monotonic() + LIMIT_CHECK_S
            # A child keeps its own time limit: the process pool stops superseded runs only.
            if self.pool == "processes":
                self.completer.stop_superseded_runs()
            elif self.completer.stop_overdue_runs():
                self.timed_out = True
                return None
        if self.holdings.reported or time.monotonic() >= self.holdings.next_beat:
            self.holdings.renew_due()
        if self.holdings:
            self.cancels.check_due()
        paused = self.controls.paused
        self.controls.read_if_due(self.store)
        self.upkeep.run_due(self.queues)
        wait = self.cadence.wait_unclaimed(woken or self.controls.paused != paused)
        if wait is not None:
            return wait
        self.cadence.claiming()
        # Nothing running: every job held is finished, waiting for its ack.
        idle = len(self.holdings) == len(self.completer.acks)
        claimed, drained = self._fill()
        if claimed and idle:
            # The woken handler thread waits for the GIL, which this thread
            # would keep through the rest of its round, up to its next wait
            # on the database: give it over now. Only from idle: with runs
            # going, the GIL could take a switch interval to come back.
            time.sleep(0)
        self.cadence.drained = drained
        self.completer.flush_acks(force=drained)
        if self.burst and drained and not self.holdings:
            return None
        self.cadence.claimed(drained)
        if claimed and not drained:
            return 0.0  # more is waiting: claim again at once
        timeout = self.cadence.next_claim()  # reads the database: a failure there backs off too
        self._db_failures = 0
        return timeout

    def _fill(self) -> tuple[int, bool]:
        """Claim up to free capacity across the queues; return (claimed, all drained)."""
        holdings, acks, controls = self.holdings, self.completer.acks, self.controls
        # Jobs whose ack is waiting are finished: their slots are free.
        free = self.capacity - len(holdings) + len(acks)
        # Claiming one job at a time would cost a round trip per job: wait for
        # a quarter of the capacity to free up unless the worker is idle.
        if free <= 0 or (len(holdings) > len(acks) and free < self.refill_at):
            return 0, False
        claimed = 0
        drained = True
        count = len(self.queues)
        for offset in range(count):
            q = self.queues[(self._rr + offset) % count]
            if q.name in controls.paused:
                continue
            if controls.held_back(q.name):
                drained = False  # jobs wait for the limit: a burst worker stays
                continue
            want = self.capacity - len(holdings) + len(self.completer.acks)
            if want <= 0:
                drained = False
                break
            got = self._claim(q, want)
            if got == want:
                drained = False
            claimed += got
        self._rr += 1
        return claimed, drained

    def _claim(self, q: Queue, want: int) -> int:
        """Claim up to ``want`` jobs of ``q`` and queue them for the lanes; return how many.

        The acks waiting in the completer ride the claim: one statement and
        one commit settle the finished jobs and claim the next ones.
        """
        acks = self.completer.take_acks()
        try:
            claim_started = time.perf_counter()
            acked, handles, hold_s = q.ack_and_claim(self.worker_id, want, fences(acks))
            self.tally.instruments.claim(q.name, time.perf_counter() - claim_started)
        except BaseException:
            # Nothing was committed: the acks are tried again.
            self.completer.put_back(acks)
            raise
        if acks:
            self.completer.report_acks(acks, acked)
        if q.limits is not None:
            self.controls.hold(q.name, hold_s)
        now = time.monotonic()
        func = self.handlers.get(q.name)
        hold = self.holdings.add
        self.pool_lanes.submit([hold(handle, func, now) for handle in handles])
        return len(handles)

    def _start_watch(self) -> None:
        """Watch the queues: in the main thread's own waits where the watcher has a socket.

        Elsewhere (SQLite's file, MariaDB's poll) a watcher thread of its own
        sets the wake-up.
        """
        heard = self.cadence.heard if self.cadence.coalesce_s else None

        def watch(interrupt_fd: int | None = None) -> QueueWatch:
            return QueueWatch(
                self.store,
                self.queues,
                self.wake,
                self.controls.changed,
                self.cancels.heard,
                heard,
                interrupt_fd,
            )

        if self.store.dialect.supports_listen_notify:
            self.wake.start(watch())
            return
        self.wake.start()
        self._watcher = WatcherThread(watch, self._halt)

    # --- outages ---------------------------------------------------------------

    def _database_error(self, exc: DatabaseError) -> None:
        """Back off and reconnect; only a connection-level error is an outage."""
        self._db_failures += 1
        delay = min(0.1 * 2**self._db_failures, DB_RETRY_MAX_S)
        if isinstance(exc, CONNECTION_ERRORS):
            logger.error(
                "database unavailable (attempt %d), retrying in %.1fs: %s",
                self._db_failures,
                delay,
                exc,
            )
        else:
            logger.error(
                "database error (attempt %d), retrying in %.1fs", self._db_failures, delay,
                exc_info=exc,
            )  # fmt: skip
        # The session's plan mode goes back before the connection is closed or
        # pooled (Django's pool), and is set again on the next one.
        self.store.dialect.own_session(False)
        connections[self.store.using].close()
        self.store.dialect.own_session()
        self._halt.wait(delay)

    # --- stopping ---------------------------------------------------------------------------

    def _shutdown(self) -> None:
        # Jobs not started yet go back at once; running ones get the grace period.
        for held in self.pool_lanes.unstarted():
            self.completer.release(held)
        try:
            self._finish_within_grace()
            self._settle_last()
            self._halt.set()
            if self._watcher is not None:
                self._watcher.stop()
            self.pool_lanes.close()
            if self._watcher is not None:
                self._watcher.join(2.0)
            self.wake.close()
        finally:
            # This thread may live on (a crew's, a test's): its statements are its own
            # again, and its session as it was before the connection is closed or pooled.
            self.store.dialect.own_session(False)
            connections[self.store.using].close()
        stats = self.stats
        logger.info(
            "worker stopped worker_id=%s acked=%d retried=%d dead=%d lost=%d released=%d "
            "snoozed=%d cancelled=%d",
            self.worker_id,
            stats.acked,
            stats.retried,
            stats.dead,
            stats.lost,
            stats.released,
            stats.snoozed,
            stats.cancelled,
        )

    def _finish_within_grace(self) -> None:
        """Settle what finishes within the grace period, renewing the claims meanwhile."""
        deadline = time.monotonic() + self.grace_s
        while self.holdings and time.monotonic() < deadline:
            try:
                self.completer.settle()
                self.completer.flush_acks(force=True)
                self.holdings.renew_due()
            except DatabaseError as exc:
                self._database_error(exc)
            # Cleared only when seen set: a set landing after a wait timed out is kept.
            if self.wake.wait(min(0.1, max(deadline - time.monotonic(), 0.0))):
                self.wake.clear()
            self.pulse.beat()

    def _settle_last(self) -> None:
        """Write the last outcomes, interrupt what still runs, leave the live-worker list."""
        try:
            self.completer.settle()
            self.completer.flush_acks(force=True)
            for lane in self.pool_lanes.lanes:
                lane.interrupt()  # a child still running a job is stopped first
            # SIGKILLed if SIGTERM did not end it: gone before its attempt is recorded.
            killed_by = time.monotonic() + KILL_GRACE_S
            for lane in self.pool_lanes.lanes:
                lane.end(killed_by)
            self.completer.interrupt_running(self.grace_s)
        except DatabaseError:
            logger.warning(
                "could not write the last outcomes; their claims will lapse", exc_info=True
            )
        try:
            self.tally.flush()
            presence.leave(self.store.using, self.worker_id)
            self.upkeep.leave()  # retention: another worker takes the table-wide prunes
        except DatabaseError:
            logger.warning("could not record outcome counts at shutdown", exc_info=True)

    def running_threads(self) -> int:
        """Return how many handlers are still inside a job (after ``run`` returned)."""
        return self.pool_lanes.running()
