"""The thread and process pools: ``--concurrency`` handler threads, each with its lane.

Each thread takes held jobs one at a time from one queue and runs them in
its lane (``pools.py``): right there (``threads``) or in the lane's child
process (``processes``).
"""

from __future__ import annotations

import contextlib
import logging
import queue as queue_module
import threading
import time

from django.db import connections

from ..error_text import describe
from ..executor import Outcome, OutcomeKind, tidy_connections
from .children import KILL_GRACE_S
from .holdings import Held
from .pools import PoolBroken, ThreadLane, make_lane
from .serving import JOB_THREAD, Pool

logger = logging.getLogger("alkstore_django.worker")


class ThreadPool(Pool):
    """One handler thread per concurrency slot, fed from one queue."""

    def start(self) -> None:
        worker = self.worker
        self._work: queue_module.SimpleQueue[Held | None] = queue_module.SimpleQueue()
        self._threads: list[threading.Thread] = []
        for index in range(worker.concurrency):
            lane = make_lane(
                worker.pool,
                f"{worker.worker_id}/{index}",
                worker.holdings.slots,
                max_jobs=worker.max_jobs_per_child,
                max_memory_mb=worker.max_memory_per_child_mb,
            )
            self.lanes.append(lane)
            thread = threading.Thread(
                target=self._serve, args=(lane,), name=f"{JOB_THREAD}-{index}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def submit(self, held: list[Held]) -> None:
        put = self._work.put
        for one in held:
            put(one)

    def unstarted(self) -> list[Held]:
        found: list[Held] = []
        while True:
            try:
                item = self._work.get_nowait()
            except queue_module.Empty:
                return found
            if item is not None:
                found.append(item)

    def close(self) -> None:
        for _ in self._threads:
            self._work.put(None)
        # Threads still inside a job after the grace period are left behind
        # (they are daemons); process lanes end once their child has.
        wait_s = 0.1 if self.worker.pool == "threads" else KILL_GRACE_S + 1
        for thread in self._threads:
            thread.join(wait_s)

    def running(self) -> int:
        return sum(thread.is_alive() for thread in self._threads)

    def _serve(self, lane: ThreadLane) -> None:
        """A handler thread: run held jobs in ``lane`` until ``None`` comes (the stop)."""
        # A child boots in parallel, before the first job; one that cannot
        # start is reported with the first job it is given.
        with contextlib.suppress(Exception):
            lane.start()
        work, not_to_run, hand_back = self._work, self.not_to_run, self.hand_back
        while True:
            held = work.get()
            if held is None:
                lane.close()
                tidy_connections(connections.close_all)
                return
            outcome = not_to_run(held)
            if outcome is not None:
                hand_back(held, outcome, True)
                continue
            held.lane = lane
            held.started_at = time.monotonic()
            try:
                outcome = lane.run(held.run, held.handler, held.slot)
            except PoolBroken as exc:
                logger.error("worker cannot run jobs, stopping: %s", exc)
                self.worker.broken = str(exc)
                outcome = Outcome(OutcomeKind.RELEASE)
            except BaseException as exc:  # noqa: BLE001 - the thread must outlive anything
                # Lanes never raise; this is the last line, so a handler thread
                # can never die and strand its job under a live claim.
                error = f"the handler could not be run: {describe(exc)}"
                outcome = Outcome(OutcomeKind.RETRY, error=error, exc=exc)
                outcome.duration_ms = (time.monotonic() - held.started_at) * 1000
            hand_back(held, outcome, work.empty())
