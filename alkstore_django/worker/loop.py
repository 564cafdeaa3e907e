"""The worker: claim in batches, run handlers on threads or in child processes, settle outcomes.

One main thread owns the worker's own database traffic (claims, acks,
heartbeats, sweeps) on one persistent connection, whatever ``CONN_MAX_AGE``
says: a site on Django's default of 0 must not pay a connection per job.
Handler threads call ``close_old_connections()`` around each job, as a
request would, so user code sees the site's usual connection policy.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue as queue_module
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Sequence

from django.db import DatabaseError, connections

from .. import presence
from ..conf import app_settings
from ..error_text import describe, timed_out
from ..errors import InvalidArgument
from ..executor import (
    CONNECTION_ERRORS,
    Outcome,
    finished,
    has_hooks,
    settle,
    tidy_connections,
)
from ..handlers import HandlerRegistry, registry
from ..notify import watch_queues
from ..operations import sweep
from ..queues import Queue
from ..store import Store, get_store
from ..validation import validate_worker_id
from .children import KILL_GRACE_S
from .holdings import Done, Held, Holdings
from .instruments import Instruments
from .pools import POOLS, PoolBroken, ProcessRunner, ThreadRunner, make_runner
from .tally import Tally, WorkerStats

logger = logging.getLogger("alkstore_django.worker")

# Finished jobs' acks wait for the next claim (one commit for both) at most
# this long before they are written on their own.
ACK_LINGER_S = 0.02
# Jobs held under claim per handler thread when --batch is not given: enough
# that a claim round trip overlaps with running what is already held.
DEFAULT_PREFETCH = 8
DB_RETRY_MAX_S = 5.0
STOP_CHECK_S = 0.25
# How often the thread pool looks for runs past their time limit.
LIMIT_CHECK_S = 0.1
# A queue at its max_running is claimed again when one of this worker's jobs
# of it finishes, or after this long (a job finishing on another worker
# sends no wake-up).
MAX_RUNNING_RECHECK_S = 0.1
INTERRUPTED = (
    "interrupted: the worker shut down while the handler was still running "
    "(it outlived the {grace_s:g} s grace period)"
)


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

    ``pool`` is where handlers run: ``threads`` (the default) or
    ``processes`` (one child process per concurrency slot, replaced after
    ``max_jobs_per_child`` jobs or past ``max_memory_per_child_mb``; see
    ``pools.py``). A run past its job's ``timeout_s`` fails that attempt with
    ``timed out after N s``: the process pool kills the child; a thread cannot
    be killed, so the thread pool records the attempt, stops claiming and
    returns after ``grace_s`` with ``timed_out`` set, for its supervisor to
    restart the process.
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
        self.tally = Tally(self.store.using, instruments)
        self.holdings = Holdings(self.capacity)
        self.pool = pool
        self.max_jobs_per_child = max_jobs_per_child
        self.max_memory_per_child_mb = max_memory_per_child_mb
        self.timed_out = False
        # Why the worker stopped on its own (a pool that cannot run jobs), if it did.
        self.broken: str | None = None
        self._runners: list[ThreadRunner] = []
        self._next_limit_check = 0.0
        self._next_announce = 0.0
        self._queues: list[Queue] = []
        self._work: queue_module.SimpleQueue[Held | None] = queue_module.SimpleQueue()
        self._done: queue_module.SimpleQueue[Done] = queue_module.SimpleQueue()
        self._unsettled: deque[Done] = deque()
        self._acks: list[Done] = []
        self._acks_since = 0.0
        self._wake = threading.Event()
        self._halt = threading.Event()
        self._threads: list[threading.Thread] = []
        self._rr = 0
        self._db_failures = 0
        # Queue controls: the paused queues (read by the handler threads
        # before each job), when a limit lets a queue be claimed again, and
        # the queues waiting for one of their running jobs to finish here.
        self._paused: frozenset[str] = frozenset()
        self._holds: dict[str, float] = {}
        self._await_finish: set[str] = set()
        self._controls = threading.Event()
        self._next_control_check = 0.0

    @property
    def stats(self) -> WorkerStats:
        """Counts since start (the tally's)."""
        return self.tally.stats

    # --- set-up -----------------------------------------------------------------

    def build_queues(self) -> list[Queue]:
        """Return a Queue for each name this worker runs; refuse a name without a handler."""
        built = []
        for name in self.queue_names:
            if self.handlers.get(name) is None:
                raise InvalidArgument(
                    f"No handler registered for queue {name!r}: expected one of "
                    f"{', '.join(map(repr, self.handlers.queues())) or 'none (add a jobs.py)'}."
                )
            built.append(self.store.handler_queue(name))
        return built

    def _start_threads(self) -> None:
        for index in range(self.concurrency):
            runner = make_runner(
                self.pool,
                f"{self.worker_id}/{index}",
                self.holdings.slots,
                max_jobs=self.max_jobs_per_child,
                max_memory_mb=self.max_memory_per_child_mb,
            )
            self._runners.append(runner)
            thread = threading.Thread(
                target=self._run_jobs, args=(runner,), name=f"alkstore-job-{index}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
        watcher = threading.Thread(target=self._watch, name="alkstore-watch", daemon=True)
        watcher.start()
        self._threads.append(watcher)

    # --- the loop -----------------------------------------------------------------

    def run(self, stop: threading.Event) -> WorkerStats:
        """Work until ``stop`` is set; return the counts."""
        self._queues = self.build_queues()
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
                    if self.broken:
                        break
                    if self.pool == "threads" and time.monotonic() >= self._next_limit_check:
                        self._expire_overdue_runs()
                        if self.timed_out:
                            break
                    if time.monotonic() >= self.holdings.next_beat:
                        self.holdings.renew_due()
                    if time.monotonic() >= self._next_announce:
                        self._announce()
                    if self._controls.is_set() or time.monotonic() >= self._next_control_check:
                        self._read_controls()
                    if time.monotonic() >= next_sweep:
                        sweep(self.store, self._queues)
                        next_sweep = time.monotonic() + self.sweep_interval_s
                    claimed, drained = self._fill()
                    self._flush_acks(force=drained)
                    if claimed and not drained:
                        continue
                    if self.burst and drained and not self.holdings:
                        break
                    timeout = self._idle_timeout(drained)
                    self._db_failures = 0
                except DatabaseError as exc:
                    self._database_error(exc)
                    continue
                # Sliced so a stop request is seen within STOP_CHECK_S.
                self._wake.wait(min(timeout, STOP_CHECK_S))
        finally:
            self._shutdown()
        return self.stats

    def _idle_timeout(self, drained: bool) -> float:
        timeout = min(self.poll_interval_s, max(self.holdings.next_beat - time.monotonic(), 0.0))
        now = time.monotonic()
        holds = [until for until in self._holds.values() if until > now]
        if holds:
            timeout = min(timeout, min(holds) - now)
        if self._acks:
            timeout = min(timeout, ACK_LINGER_S)
        if drained and len(self.holdings) < self.capacity:
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
        free = self.capacity - len(self.holdings) + len(self._acks)
        # Claiming one job at a time would cost a round trip per job: wait for
        # a quarter of the capacity to free up unless the worker is idle.
        if free <= 0 or (len(self.holdings) > len(self._acks) and free < self._refill_at):
            return 0, False
        claimed = 0
        drained = True
        count = len(self._queues)
        for offset in range(count):
            q = self._queues[(self._rr + offset) % count]
            if q.name in self._paused:
                continue
            if self._holds.get(q.name, 0.0) > time.monotonic():
                drained = False  # jobs wait for the limit: a burst worker stays
                continue
            want = self.capacity - len(self.holdings) + len(self._acks)
            if want <= 0:
                drained = False
                break
            acks, self._acks = self._acks, []
            fences = [(d.held.handle.job.id, d.held.handle.job.generation) for d in acks]
            try:
                claim_started = time.perf_counter()
                acked, handles, hold_s = q.ack_and_claim(self.worker_id, want, fences)
                self.tally.instruments.claim(q.name, time.perf_counter() - claim_started)
            except BaseException:
                # Nothing was committed: the acks are tried again.
                self._acks = acks + self._acks
                raise
            if acks:
                self._report_acks(acks, acked)
            if q.limits is not None:
                self._hold(q.name, hold_s)
            if len(handles) == want:
                drained = False
            now = time.monotonic()
            func = self.handlers.get(q.name)
            for handle in handles:
                self._work.put(self.holdings.add(handle, func, now))
            claimed += len(handles)
        self._rr += 1
        return claimed, drained

    # --- queue controls --------------------------------------------------------------

    def _hold(self, name: str, hold_s: float | None) -> None:
        """Record how long a limit holds ``name``'s next claim back (None: it does not)."""
        self._await_finish.discard(name)
        if hold_s is None:
            self._holds.pop(name, None)
        elif hold_s == 0.0:
            self._holds[name] = time.monotonic() + MAX_RUNNING_RECHECK_S
            self._await_finish.add(name)
        else:
            self._holds[name] = time.monotonic() + hold_s

    def _read_controls(self) -> None:
        """Read which of the worker's queues are paused (on a pause or resume, and every poll).

        The claim itself refuses a paused queue; this is for the jobs already
        held: a handler thread gives back, unstarted, a job of a paused queue.
        """
        self._controls.clear()
        self._next_control_check = time.monotonic() + self.poll_interval_s
        paused = self.store.dialect.paused_queues()
        self._paused = frozenset(name for name in self.queue_names if name in paused)

    # --- handler threads ------------------------------------------------------------

    def _run_jobs(self, runner: ThreadRunner) -> None:
        if isinstance(runner, ProcessRunner):
            # Children boot in parallel, before the first job; one that cannot
            # start is reported with the first job it is given.
            with contextlib.suppress(Exception):
                runner.start()
        while True:
            held = self._work.get()
            if held is None:
                runner.close()
                tidy_connections(connections.close_all)
                return
            if held.handle.job.queue in self._paused:
                # Not started: the claim's attempt goes back with the job.
                self._done.put(Done(held, Outcome("release")))
                self._wake.set()
                continue
            held.started_at = time.monotonic()
            try:
                outcome = runner.run(held.handle.job, held.handler, held.slot)
            except PoolBroken as exc:
                logger.error("worker cannot run jobs, stopping: %s", exc)
                self.broken = str(exc)
                outcome = Outcome("release")
            except BaseException as exc:  # noqa: BLE001 - the thread must outlive anything
                # Runners never raise; this is the last line, so a handler
                # thread can never die and strand its job under a live claim.
                outcome = Outcome("retry", error=f"the handler could not be run: {describe(exc)}")
            self._done.put(Done(held, outcome))
            # Wake the main thread when it has a batch to settle and claim, or
            # when this thread is about to go idle; not once per job.
            if self._work.empty() or self._done.qsize() >= self._refill_at:
                self._wake.set()

    def _watch(self) -> None:
        watch_queues(self.store, self._queues, self._wake, self._halt, self._controls)
        tidy_connections(connections.close_all)

    # --- settling outcomes -------------------------------------------------------------

    def _settle(self) -> None:
        """Apply the finished jobs' outcomes, oldest first.

        Plain acks wait for the next claim (see ``_fill``); acks whose handler
        writes a result, and failures, are settled here, one transaction each,
        so a job whose outcome cannot be recorded harms no other. A lost
        connection leaves the rest in line for the next round: nothing is dropped.
        """
        while True:
            try:
                self._unsettled.append(self._done.get_nowait())
            except queue_module.Empty:
                break
        while self._unsettled:
            done = self._unsettled[0]
            if self._await_finish and done.held.handle.job.queue in self._await_finish:
                # One of its running jobs finished here: its place may be free.
                self._hold(done.held.handle.job.queue, None)
            if done.outcome.kind == "ack" and not has_hooks(done.held.handler):
                if not self._acks:
                    self._acks_since = time.monotonic()
                self._acks.append(done)
            elif done.outcome.kind == "release":
                self._release(done.held)
            else:
                result = settle(done.held.handle, done.outcome, done.held.handler, self.store.using)
                self.holdings.forget(done.held)
                self.tally.record(done.held.handle.job, done.outcome, result)
            self._unsettled.popleft()
        if self.tally.flush_due():
            self.tally.flush()

    def _flush_acks(self, force: bool = False) -> None:
        """Write the waiting acks on their own when no claim is coming to carry them."""
        if not self._acks:
            return
        if not force and (
            len(self._acks) < self._refill_at and time.monotonic() - self._acks_since < ACK_LINGER_S
        ):
            return
        acks, self._acks = self._acks, []
        fences = [(d.held.handle.job.id, d.held.handle.job.generation) for d in acks]
        try:
            acked = set(self.store.dialect.ack_fenced(self.worker_id, fences))
        except BaseException:
            self._acks = acks + self._acks
            raise
        self._report_acks(acks, acked)

    def _report_acks(self, acks: list[Done], acked: set[int]) -> None:
        """Log committed acks (only once they are durable) and free their slots."""
        for done in acks:
            handle = done.held.handle
            handle.mark_spent()
            self.holdings.forget(done.held)
            result = "acked" if handle.job.id in acked else "lost"
            self.tally.record(handle.job, done.outcome, result)
            finished(handle.job, done.outcome, result)

    def _expire_overdue_runs(self) -> None:
        """Thread pool: fail each run past its time limit; a stuck thread stops the worker.

        Python cannot stop the thread, so the attempt is recorded (retried
        with backoff, or dead-lettered), its claim is no longer renewed, and
        the worker stops claiming and exits after its grace period for its
        supervisor to restart it, as gunicorn does with a stuck worker.
        """
        now = time.monotonic()
        self._next_limit_check = now + LIMIT_CHECK_S
        for held in self.holdings.past_time_limit(now):
            limit = held.handle.job.timeout_s
            assert limit is not None
            outcome = Outcome("retry", error=timed_out(limit))
            result = settle(held.handle, outcome, held.handler, self.store.using)
            self.holdings.forget(held, reuse_slot=False)
            self.tally.record(held.handle.job, outcome, result)
            logger.error(
                "handler timed out id=%s queue=%s after %gs: a thread cannot be stopped, so "
                "this worker stops claiming and exits after its grace period (%gs); use "
                "--pool processes for hard limits",
                held.handle.job.id,
                held.handle.job.queue,
                limit,
                self.grace_s,
            )
            self.timed_out = True

    # --- upkeep ---------------------------------------------------------------------------

    def _announce(self) -> None:
        """Tell the live-worker list this worker is alive, with its counts so far."""
        self._next_announce = time.monotonic() + app_settings.worker_ttl_s / 3
        stats = self.stats
        presence.announce(
            self.store.using,
            self.worker_id,
            queues=self.queue_names,
            pool=self.pool,
            concurrency=self.concurrency,
            counts=(stats.acked, stats.retried, stats.dead),
        )

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
        while self.holdings and time.monotonic() < deadline:
            try:
                self._settle()
                self._flush_acks(force=True)
                self.holdings.renew_due()
            except DatabaseError as exc:
                self._database_error(exc)
            self._wake.wait(min(0.1, max(deadline - time.monotonic(), 0.0)))
            self._wake.clear()
        try:
            self._settle()
            self._flush_acks(force=True)
            for runner in self._runners:
                runner.interrupt()  # a child still running a job is stopped first
            self._interrupt_running()
        except DatabaseError:
            logger.warning(
                "could not write the last outcomes; their claims will lapse", exc_info=True
            )
        try:
            self.tally.flush()
            presence.leave(self.store.using, self.worker_id)
        except DatabaseError:
            logger.warning("could not record outcome counts at shutdown", exc_info=True)
        self._halt.set()
        for _ in range(self.concurrency):
            self._work.put(None)
        # Handler threads still inside a job after the grace period are left
        # behind (they are daemons); process runners end once their child has.
        job_wait_s = 0.1 if self.pool == "threads" else KILL_GRACE_S + 1
        for thread in self._threads:
            thread.join(job_wait_s if thread.name.startswith("alkstore-job") else 2.0)
        connections[self.store.using].close()
        logger.info(
            "worker stopped worker_id=%s acked=%d retried=%d dead=%d lost=%d released=%d "
            "snoozed=%d",
            self.worker_id,
            self.stats.acked,
            self.stats.retried,
            self.stats.dead,
            self.stats.lost,
            self.stats.released,
            self.stats.snoozed,
        )

    def _interrupt_running(self) -> None:
        """Record the attempt of every job still running as interrupted.

        Releasing it would let another worker start it at the same attempt
        while this handler still runs; leaving the claim to lapse would hide
        why it ran again. Finished jobs whose outcome could not be written are
        left to lapse (their handles' outcomes are unknown to the database).
        """
        finished = {d.held.handle.job.id for d in [*self._acks, *self._unsettled]}
        interrupted = Outcome("retry", error=INTERRUPTED.format(grace_s=self.grace_s))
        for held in self.holdings:
            if held.handle.job.id in finished:
                continue
            result = settle(held.handle, interrupted, held.handler, self.store.using)
            self.holdings.forget(held)
            self.tally.record(held.handle.job, interrupted, result)

    def running_threads(self) -> int:
        """Return how many handler threads are still inside a job (after ``run`` returned)."""
        return sum(t.is_alive() for t in self._threads if t.name.startswith("alkstore-job"))

    def _release(self, held: Held) -> None:
        try:
            released = held.handle.release()
        except DatabaseError:
            logger.warning("could not release id=%s; its claim will lapse", held.handle.job.id)
            return
        self.holdings.forget(held)
        if released:
            self.stats.released += 1
            logger.info(
                "job id=%s queue=%s outcome=released attempts=%s",
                held.handle.job.id,
                held.handle.job.queue,
                held.handle.job.attempts - 1,
            )
