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
- ``purge_attempts``: the attempt history of jobs that are gone;
- ``purge_workers``: the rows of workers long silent;
- ``prune_throughput``: the per-minute throughput counters past a day (hourly);
- ``settle_workflows``: the steps whose job left by a path that is not an
  outcome (an expiry, a dead worker's last attempt, an operator's delete);
- ``prune_results``: kept job results past their ``expires_at``, and finished
  workflows past ``WORKFLOW_RETENTION_S``;
- ``adopt_unkeyed``: on a queue with ``max_running_per_key``, the pending jobs
  left with no key at all (enqueued before the queue had the limit, or
  requeued from a dead letter of then) get the unlimited one, ``UNKEYED``,
  which the keyed claim reads.

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

from .. import presence, results
from ..conf import app_settings
from ..history import purge_orphaned_attempts
from ..records import UNKEYED
from ..throughput import PRUNE_INTERVAL_S
from ..throughput import prune_throughput as prune_counters
from ..workflows.progress import prune_finished, settle_orphans

if TYPE_CHECKING:
    from ..queues import Queue
    from ..store import Store
    from .loop import Worker

logger = logging.getLogger("alkstore_django.worker")

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


def purge_attempts(store: Store, queues: Sequence[Queue]) -> None:
    """Delete the attempt history of jobs that are gone (acked, or their dead letter purged)."""
    purge_orphaned_attempts(store.using)


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
    next_at: float = 0.0

    def run_if_due(self, store: Store, queues: Sequence[Queue]) -> None:
        """Run the chore if its time has come."""
        if time.monotonic() < self.next_at:
            return
        if not self.retry_failed:
            self.next_at = time.monotonic() + self.interval_s
        self.run(store, queues)
        self.next_at = time.monotonic() + self.interval_s


class Upkeep:
    """The chores of one ``worker``, in the order they run.

    Each starts due: a worker does its upkeep as it starts, then on each
    chore's interval (``SWEEP_INTERVAL_S`` or the worker's ``sweep_interval_s``).
    """

    def __init__(self, worker: Worker) -> None:
        self.store = worker.store
        sweep_interval_s = worker.sweep_interval_s
        run_announce = functools.partial(announce, worker)
        self.chores = [
            Chore("announce", run_announce, app_settings.worker_ttl_s / 3, False),
            Chore("tend_partitions", tend_partitions, sweep_interval_s),
            Chore("expire_jobs", expire_jobs, sweep_interval_s),
            Chore("bury_lapsed", bury_lapsed, sweep_interval_s),
            Chore("purge_attempts", purge_attempts, sweep_interval_s),
            Chore("purge_workers", purge_workers, sweep_interval_s),
            Chore("prune_throughput", prune_throughput, PRUNE_INTERVAL_S, False),
            Chore("settle_workflows", settle_workflows, sweep_interval_s),
            Chore("prune_results", prune_results, sweep_interval_s),
            Chore("adopt_unkeyed", adopt_unkeyed, sweep_interval_s),
        ]
        self._next_at = 0.0

    def run_due(self, queues: Sequence[Queue]) -> None:
        """Run every chore whose time has come; a database error propagates to the loop."""
        # Asked every round of the loop, often several times a batch: one clock
        # read until the soonest chore is due.
        if time.monotonic() < self._next_at:
            return
        try:
            for chore in self.chores:
                chore.run_if_due(self.store, queues)
        finally:
            self._next_at = min(chore.next_at for chore in self.chores)

    def hurry(self, name: str) -> None:
        """Make the chore ``name`` due now: the loop's next round runs it."""
        for chore in self.chores:
            if chore.name == name:
                chore.next_at = 0.0
        self._next_at = 0.0
