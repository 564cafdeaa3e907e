"""The asyncio pool: ``--concurrency`` runs at once on one event loop, for handlers that wait.

One thread runs an event loop with a lane coroutine per concurrency slot;
each takes held jobs one at a time, as a handler thread does. An ``async
def`` handler runs on the loop, in a task of its own, so a run that waits
(a socket, an API call, ``asyncio.sleep``) costs a coroutine, not a thread.
A sync handler runs in a bounded thread executor (``SYNC_THREADS``), in a
``ThreadLane`` of its own thread, exactly as in the thread pool.

The loop's main thread stops a run here as in the other pools (``stop``):
a coroutine is cancelled, and what the ``CancelledError`` ended is recorded
as the stop meant (timed out, cancelled). A coroutine that swallows its
cancellation and runs on is reported after ``RECLAIM_S``: its attempt is
recorded as the stop meant and its slot runs other jobs, while it goes on
detached (nothing can end a coroutine that refuses to). A loop that a
handler blocks (a sync call inside a coroutine) stops everything on it; the
time limit then finds the run stuck, as a thread that does not stop is.

The async ORM's calls run in asgiref's one thread-sensitive thread, as in
an async view; its connections are tidied there every ``TIDY_EVERY_S``, as
``close_old_connections`` would around requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections, connections

from ..error_text import describe
from ..errors import TimeLimitExceeded
from ..executor import (
    ACK,
    Outcome,
    OutcomeKind,
    arun_handler,
    outcome_of,
    settles_alone,
    tidy_connections,
)
from ..signals import job_started, send_robust
from .holdings import Held
from .pools import ThreadLane
from .serving import JOB_THREAD, Pool
from .slots import RETURNED, RUNNING

if TYPE_CHECKING:
    from .loop import Worker

logger = logging.getLogger("alkstore_django.worker")

# At most this many sync handlers run at once in the asyncio pool (and never
# more than --concurrency): the bound of Python's own default executor.
SYNC_THREADS = 32
# How long a cancelled coroutine has to end before its slot is taken back.
RECLAIM_S = 0.5
TIDY_EVERY_S = 1.0
# How long the worker's thread waits on the loop for a reply at shutdown.
LOOP_REPLY_S = 5.0


def is_async(func: Any) -> bool:
    """True for an ``async def`` handler (or a callable object whose call is one)."""
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(
        getattr(func, "__call__", None)  # noqa: B004 - a callable object's own method
    )


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class AsyncioPool(Pool):
    """One event loop thread running up to ``--concurrency`` handlers; its own only lane."""

    def __init__(self, worker: Worker) -> None:
        super().__init__(worker)
        # The loop's main thread stops and interrupts runs through the pool itself.
        self.lanes = [self]
        self._slots = worker.holdings.slots
        self._concurrency = worker.concurrency
        self._loop = asyncio.new_event_loop()
        self._executor = ThreadPoolExecutor(
            max_workers=min(SYNC_THREADS, worker.concurrency),
            thread_name_prefix=f"{JOB_THREAD}-sync",
        )
        self._thread = threading.Thread(target=self._main, name=f"{JOB_THREAD}-loop", daemon=True)
        self._ready = threading.Event()
        self._queue: asyncio.Queue[Held | None] | None = None
        # By claim slot: the coroutine run's task and what its hand-back waits on.
        self._tasks: dict[int, asyncio.Task[Outcome]] = {}
        self._ended: dict[int, asyncio.Future[None]] = {}
        # What a stop of a slot's run means (the exception it stands for).
        self._stops: dict[int, type[BaseException]] = {}
        # The thread lanes running sync handlers, by slot (written in their threads).
        self._thread_lanes: dict[int, ThreadLane] = {}
        self._local = threading.local()
        self._detached: set[asyncio.Task[Outcome]] = set()

    # --- the pool, called from the worker's main thread ---------------------------

    def start(self) -> None:
        self._thread.start()
        self._ready.wait()

    def submit(self, held: list[Held]) -> None:
        self._loop.call_soon_threadsafe(self._put, held)

    def unstarted(self) -> list[Held]:
        try:
            return self._ask(self._take_unstarted())
        except FutureTimeout:
            logger.warning("the event loop did not answer: jobs not started stay claimed")
            return []

    def close(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._put, [None] * self._concurrency)
        self._thread.join(1.0)
        self._executor.shutdown(wait=False, cancel_futures=True)

    def running(self) -> int:
        return len(self._tasks) + len(self._thread_lanes) + len(self._detached)

    # --- the lane: stopping runs, from the worker's main thread --------------------

    def stop(self, slot: int, exc: type[BaseException] = TimeLimitExceeded) -> bool:
        """Stop the run of ``slot``: cancel its coroutine, or raise ``exc`` in its thread."""
        lane = self._thread_lanes.get(slot)
        if lane is not None:
            return lane.stop(slot, exc)
        self._loop.call_soon_threadsafe(self._cancel, slot, exc)
        return True

    def tell_cancel(self, slot: int) -> None:
        """Nothing to tell: the handler reads the run the worker marked."""

    def interrupt(self) -> None:
        """Cancel every coroutine still running (at shutdown, after the grace period)."""
        self._loop.call_soon_threadsafe(self._cancel_all)

    def end(self, deadline: float) -> None:
        """Return once the cancelled coroutines have ended, or at ``deadline``."""
        with contextlib.suppress(FutureTimeout):
            self._ask(self._wait_tasks(max(deadline - time.monotonic(), 0.0)))

    def _ask(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(LOOP_REPLY_S)

    # --- on the loop -----------------------------------------------------------------

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        finally:
            self._loop.close()
            tidy_connections(connections.close_all)

    async def _serve(self) -> None:
        self._queue = asyncio.Queue()
        lanes = [asyncio.create_task(self._lane()) for _ in range(self._concurrency)]
        tidy = asyncio.create_task(self._tidy())
        self._ready.set()
        await asyncio.gather(*lanes)
        tidy.cancel()

    def _put(self, held: Sequence[Held | None]) -> None:
        assert self._queue is not None
        for one in held:
            self._queue.put_nowait(one)

    async def _take_unstarted(self) -> list[Held]:
        assert self._queue is not None
        found: list[Held] = []
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if item is not None:
                found.append(item)
        return found

    async def _lane(self) -> None:
        """A lane: run held jobs one at a time until ``None`` comes (the stop)."""
        queue = self._queue
        assert queue is not None
        while True:
            held = await queue.get()
            if held is None:
                return
            outcome = self.not_to_run(held)
            try:
                if outcome is None and is_async(held.handler):
                    held.lane = self
                    held.started_at = time.monotonic()
                    outcome = await self._run_coroutine(held)
                elif outcome is None:
                    outcome = await self._loop.run_in_executor(
                        self._executor, self._run_in_thread, held
                    )
            except Exception as exc:  # noqa: BLE001 - a lane must outlive anything
                # The last line, as a handler thread's: a lane that died would
                # strand its job under a live claim and shrink the pool.
                error = f"the handler could not be run: {describe(exc)}"
                outcome = Outcome(OutcomeKind.RETRY, error=error, exc=exc)
            self.hand_back(held, outcome, queue.empty())

    async def _run_coroutine(self, held: Held) -> Outcome:
        slot, job = held.slot, held.handle.job
        self._slots.mark(slot, RUNNING)
        task = asyncio.create_task(self._job(held))
        ended: asyncio.Future[None] = self._loop.create_future()
        task.add_done_callback(lambda _: _resolve(ended))
        self._tasks[slot], self._ended[slot] = task, ended
        try:
            await ended
            stop = self._stops.get(slot)
        finally:
            del self._tasks[slot], self._ended[slot]
            self._stops.pop(slot, None)
        if not task.done():
            # It swallowed its cancellation: recorded as the stop meant, its slot reused.
            held.detached = True
            self._detached.add(task)
            task.add_done_callback(self._detached.discard)
            return self._stopped(held, stop)
        try:
            outcome = task.result()
        except asyncio.CancelledError:
            outcome = self._stopped(held, stop)
        if outcome.kind == ACK and not settles_alone(held.handler, job):
            # Should the process die before the ack commits, its sentinel acks it.
            self._slots.mark(slot, RETURNED)
        return outcome

    async def _job(self, held: Held) -> Outcome:
        job = held.handle.job
        send_robust(job_started, job.queue, job=job)
        return await arun_handler(held.handler, job, job, held.run)

    def _stopped(self, held: Held, stop: type[BaseException] | None) -> Outcome:
        """Return the outcome of a run its cancellation ended (or abandoned), as the stop meant.

        A cancellation nobody here asked for (the handler cancelled itself)
        is the handler's failure, as any other exception.
        """
        outcome = outcome_of((stop or asyncio.CancelledError)(), held.handler, held.handle.job)
        if held.started_at is not None:
            outcome.duration_ms = (time.monotonic() - held.started_at) * 1000
        return outcome

    def _cancel(self, slot: int, exc: type[BaseException]) -> None:
        task = self._tasks.get(slot)
        if task is None or task.done():
            return
        self._stops[slot] = exc
        task.cancel()
        self._loop.call_later(RECLAIM_S, self._reclaim, slot, task)

    def _reclaim(self, slot: int, task: asyncio.Task[Outcome]) -> None:
        """Give up on a cancelled coroutine that is still running: hand its slot back."""
        ended = self._ended.get(slot)
        if task.done() or self._tasks.get(slot) is not task or ended is None:
            return
        logger.error(
            "handler ignored its cancellation slot=%d: its attempt is recorded as stopped and "
            "the coroutine runs on, detached, until it returns or the worker exits",
            slot,
        )
        _resolve(ended)

    def _cancel_all(self) -> None:
        for slot in list(self._tasks):
            self._cancel(slot, TimeLimitExceeded)

    async def _wait_tasks(self, timeout_s: float) -> None:
        running = [*self._tasks.values(), *self._detached]
        if running:
            await asyncio.wait(running, timeout=timeout_s)

    async def _tidy(self) -> None:
        """Tidy the async ORM's connections now and then, as requests would around them."""
        tidy = sync_to_async(tidy_connections, thread_sensitive=True)
        while True:
            await asyncio.sleep(TIDY_EVERY_S)
            await tidy(close_old_connections)

    # --- in an executor thread ------------------------------------------------------

    def _run_in_thread(self, held: Held) -> Outcome:
        """Run a sync handler in this executor thread's own ``ThreadLane``.

        Its run starts here, not when it was queued for a thread: a job that
        waits for one of the executor's threads is not charged that wait
        against its time limit.
        """
        lane = getattr(self._local, "lane", None)
        if lane is None:
            lane = self._local.lane = ThreadLane(self._slots)
            lane.start()
        self._thread_lanes[held.slot] = lane
        held.lane = self
        held.started_at = time.monotonic()
        try:
            return lane.run(held.run, held.handler, held.slot)
        finally:
            del self._thread_lanes[held.slot]
