"""The worker's upkeep: the periodic chores beside the claim loop, one small named chore each.

As River's ``internal/maintenance`` has one service per chore, each chore
here is a function of the store and the worker's queues, run by ``Upkeep``
when its interval has passed:

- ``announce``: this worker's row in the live-worker list, with its counts
  (every third of ``WORKER_TTL_S``);
- ``tend_partitions``: the dead letters' partitions of the coming days (PostgreSQL);
- ``expire_jobs``: each of the worker's queues' expired jobs to the dead
  letters, and its dead letters past retention purged (``SWEEP_INTERVAL_S``);
- ``bury_lapsed``: exhausted lapsed claims of *any* queue to the dead letters
  (a queue whose workers are gone would keep them processing for ever);
- ``purge_attempts``: the safety net of the attempt history, the walk of
  ``history.OrphanSweep`` (hourly; the history normally leaves with its
  job: with its dead letter, or after its ack);
- ``purge_workers``: the rows of workers long silent;
- ``prune_throughput``: the per-minute counters past ``THROUGHPUT_RETENTION_S`` (hourly);
- ``settle_workflows``: the steps whose job left by a path that is not an
  outcome (an expiry, a dead worker's last attempt, an operator's delete);
- ``prune_results``: kept job results past their ``expires_at``, and finished
  workflows past ``WORKFLOW_RETENTION_S``;
- ``adopt_unkeyed``: on a queue with ``max_running_per_key``, the pending jobs
  left with no key at all (enqueued before the queue had the limit, or
  requeued from a dead letter of then) get the unlimited one, ``UNKEYED``,
  which the keyed claim reads.

The table-wide prunes (``purge_attempts``, ``purge_workers``,
``prune_throughput``, ``prune_results``) are the leader's: one worker per
database runs them, the holder of the lease ``UPKEEP_LOCK``, so two workers
never delete the same rows; the others skip them. Every prune deletes in
batches, each its own short transaction (``Dialect.in_batches``).

A chore that fails with a database error is, like the sweep it came from,
tried again on the loop's next round, after the loop's back-off; the
announcement and the throughput pruning wait for their next interval instead.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError

from .. import presence, results
from ..conf import app_settings
from ..history import ORPHAN_SWEEP_INTERVAL_S, OrphanSweep
from ..locks import LockHandle, acquire, default_owner
from ..records import UNKEYED
from ..throughput import PRUNE_INTERVAL_S
from ..throughput import prune_throughput as prune_counters
from ..workflows.progress import prune_finished, settle_orphans

if TYPE_CHECKING:
    from ..queues import Queue
    from ..store import Store
    from .loop import Worker

logger = logging.getLogger("alkstore_django.worker")

# The lease of the upkeep leader: the one worker per database that runs the
# table-wide prunes. Held for this many of its sweep intervals, renewed at each.
UPKEEP_LOCK = "__alkstore_upkeep"
LEADER_TTL_SWEEPS = 3

ChoreRun = Callable[["Store", Sequence["Queue"]], Any]


def announce(worker: Worker, store: Store, queues: Sequence[Queue]) -> None:
    """Tell the live-worker list ``worker`` is alive, with its counts so far."""
    stats = worker.stats
    presence.announce(
        store.using,
        worker.worker_id,
        queues=worker.queue_names,
        pool=worker.pool,
        concurrency=worker.concurrency,
        counts=(stats.acked, stats.retried, stats.dead),
    )


def tend_partitions(store: Store, queues: Sequence[Queue]) -> None:
    """Create the dead letters' partitions of the coming days (an engine without them: nothing)."""
    store.dialect.tend_partitions()


def expire_jobs(store: Store, queues: Sequence[Queue]) -> None:
    """Dead-letter the expired jobs of ``queues`` and purge their dead letters past retention."""
    for q in queues:
        result = q.sweep_expired()
        if result.expired or result.purged:
            logger.info(
                "swept queue=%s expired=%d purged=%d", q.name, result.expired, result.purged
            )


def bury_lapsed(store: Store, queues: Sequence[Queue]) -> None:
    """Dead-letter the exhausted lapsed claims of any queue."""
    buried = store.dialect.bury_exhausted_lapsed()
    if buried:
        logger.warning("buried exhausted lapsed claims count=%d (any queue)", buried)


def purge_attempts(sweep: OrphanSweep, store: Store, queues: Sequence[Queue]) -> None:
    """Go on with the walk that deletes the attempt history of jobs that are gone."""
    deleted = sweep.run(store.using)
    if deleted:
        logger.info("purged orphaned attempts count=%d read=%d", deleted, sweep.read)


def purge_workers(store: Store, queues: Sequence[Queue]) -> None:
    """Delete the live-worker rows of workers long silent."""
    presence.purge_gone(store.using)


def prune_throughput(store: Store, queues: Sequence[Queue]) -> None:
    """Delete the per-minute throughput counters older than a day."""
    prune_counters(store.using)


def settle_workflows(store: Store, queues: Sequence[Queue]) -> None:
    """Finish the workflow steps whose job left without an outcome of its own."""
    settled = settle_orphans(store)
    if settled:
        logger.info("settled workflow steps count=%d (jobs gone by a sweep or a cancel)", settled)


def prune_results(store: Store, queues: Sequence[Queue]) -> None:
    """Delete kept results past their expiry and finished workflows past their retention."""
    results.prune(store)
    prune_finished(store)


def adopt_unkeyed(store: Store, queues: Sequence[Queue]) -> None:
    """Give the keyed queues' pending jobs without any key the unlimited key ``UNKEYED``."""
    from ..models import Job

    for queue in queues:
        if queue.keyed:
            Job.objects.using(store.using).filter(
                queue=queue.name, state="pending", concurrency_key__isnull=True
            ).update(concurrency_key=UNKEYED)


@dataclass
class Chore:
    """One periodic chore: ``run`` every ``interval_s`` seconds (monotonic ``next_at``)."""

    name: str
    run: ChoreRun
    interval_s: float
    # False: a run that fails waits for the next interval like one that succeeded.
    retry_failed: bool = True
    # True: a table-wide chore, run by the upkeep leader only.
    leader_only: bool = False
    next_at: float = 0.0

    def due(self) -> bool:
        """True once the chore's interval has passed."""
        return time.monotonic() >= self.next_at

    def skip(self) -> None:
        """Wait for the next interval without running (another worker leads)."""
        self.next_at = time.monotonic() + self.interval_s

    def run_if_due(self, store: Store, queues: Sequence[Queue]) -> None:
        """Run the chore if its time has come."""
        if not self.due():
            return
        if not self.retry_failed:
            self.next_at = time.monotonic() + self.interval_s
        self.run(store, queues)
        self.next_at = time.monotonic() + self.interval_s


class Leadership:
    """Whether this worker is the upkeep leader of its database: it holds ``UPKEEP_LOCK``.

    Asked in each round where a table-wide chore is due, so the leader
    renews its lease at least once a sweep interval and keeps it while it
    lives; when it stops (``leave``) or dies, another worker takes the lease
    at its next sweep once it has expired.
    """

    def __init__(self, store: Store, ttl_s: float) -> None:
        self.store = store
        self.ttl_s = ttl_s
        # One owner per worker run: the same worker asking again renews.
        self.owner = default_owner()
        self.handle: LockHandle | None = None

    def held(self) -> bool:
        """Take or renew the lease; True while this worker leads."""
        self.handle = acquire(self.store, UPKEEP_LOCK, ttl_s=self.ttl_s, owner=self.owner)
        return self.handle is not None

    def leave(self) -> None:
        """Give the lease up, so another worker leads at its next sweep, not a TTL later."""
        if self.handle is None:
            return
        try:
            self.handle.release()
        except DatabaseError:
            logger.warning("could not release the upkeep lease; it expires", exc_info=True)
        self.handle = None


class Upkeep:
    """The chores of one ``worker``, in the order they run.

    Each starts due: a worker does its upkeep as it starts, then on each
    chore's interval (``SWEEP_INTERVAL_S`` or the worker's ``sweep_interval_s``).
    The table-wide ones run on the upkeep leader only (``Leadership``).
    """

    def __init__(self, worker: Worker) -> None:
        self.store = worker.store
        sweep_interval_s = worker.sweep_interval_s
        self.leadership = Leadership(self.store, sweep_interval_s * LEADER_TTL_SWEEPS)
        self.orphans = OrphanSweep()
        run_announce = functools.partial(announce, worker)
        run_purge_attempts = functools.partial(purge_attempts, self.orphans)
        self.chores = [
            Chore("announce", run_announce, app_settings.worker_ttl_s / 3, False),
            Chore("tend_partitions", tend_partitions, sweep_interval_s),
            Chore("expire_jobs", expire_jobs, sweep_interval_s),
            Chore("bury_lapsed", bury_lapsed, sweep_interval_s),
            Chore(
                "purge_attempts",
                run_purge_attempts,
                ORPHAN_SWEEP_INTERVAL_S,
                retry_failed=False,
                leader_only=True,
            ),
            Chore("purge_workers", purge_workers, sweep_interval_s, leader_only=True),
            Chore(
                "prune_throughput",
                prune_throughput,
                PRUNE_INTERVAL_S,
                retry_failed=False,
                leader_only=True,
            ),
            Chore("settle_workflows", settle_workflows, sweep_interval_s),
            Chore("prune_results", prune_results, sweep_interval_s, leader_only=True),
            Chore("adopt_unkeyed", adopt_unkeyed, sweep_interval_s),
        ]
        self._next_at = 0.0

    def run_due(self, queues: Sequence[Queue]) -> None:
        """Run every chore whose time has come; a database error propagates to the loop."""
        # Asked every round of the loop, often several times a batch: one clock
        # read until the soonest chore is due.
        if time.monotonic() < self._next_at:
            return
        leading: bool | None = None
        try:
            for chore in self.chores:
                if chore.leader_only and chore.due():
                    if leading is None:
                        leading = self.leadership.held()
                    if not leading:
                        chore.skip()
                        continue
                chore.run_if_due(self.store, queues)
        finally:
            self._next_at = min(chore.next_at for chore in self.chores)

    def hurry(self, name: str) -> None:
        """Make the chore ``name`` due now: the loop's next round runs it."""
        for chore in self.chores:
            if chore.name == name:
                chore.next_at = 0.0
        self._next_at = 0.0

    def leave(self) -> None:
        """Stop leading the table-wide chores (the worker is stopping)."""
        self.leadership.leave()
