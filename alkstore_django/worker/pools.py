"""Where a worker's handlers run: the lanes of its pool, each a thread that may drive a child.

A pool (``--pool threads`` or ``processes``) is ``--concurrency`` lanes: one
handler thread each, which takes held jobs one at a time (``threads.py``);
the asyncio pool (``aio.py``) runs its sync handlers in thread lanes too.
A lane is what that thread does with a job. ``ThreadLane`` calls the handler
right there. ``ProcessLane`` hands the job to the lane's child process
(``children.py``) and waits, which lets it enforce a hard time limit, survive
the child's death and recycle leaking children. Both mark the job's claim
slot (``slots.py``) so that the worker's sentinel knows what was running.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from typing import Any

from ..error_text import describe
from ..errors import TimeLimitExceeded
from ..executor import ACK, Outcome, run_job, settles_alone
from ..runs import Run
from .children import Child, ChildGone
from .slots import RETURNED, RUNNING, ClaimSlots

logger = logging.getLogger("alkstore_django.worker")

POOLS = ("threads", "processes", "asyncio")


class PoolBroken(Exception):
    """A lane cannot run jobs at all (its child process does not start)."""


def _raise_in(thread_id: int, exc: type[BaseException] | None) -> int:
    """Raise ``exc`` in thread ``thread_id`` at its next bytecode (None: cancel); return 0 or 1."""
    target, raised = ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc else None
    return int(ctypes.pythonapi.PyThreadState_SetAsyncExc(target, raised))


class ThreadLane:
    """Run handlers in the calling thread; a run past its limit is stopped by a raised time-out.

    Python cannot kill a thread, but it can raise an exception in one
    (``stop``), as Dramatiq's time limit does. It lands at the handler's next
    bytecode: a handler blocked inside C (a long ``time.sleep``, a socket
    read without a timeout) or one that swallows it does not stop.
    """

    def __init__(self, slots: ClaimSlots) -> None:
        self.slots = slots
        # The slot whose handler this lane's thread is inside (-1: none), and
        # whether the loop is stopping one: the two halves of the handshake
        # that keeps a raised time-out from landing outside the handler. Plain
        # stores on the hot path; the lock is taken only once a stop was asked.
        self.inside = -1
        self.stopping = False
        self._thread_id = 0
        self._lock = threading.Lock()

    def start(self) -> None:
        """Nothing to start: the thread is the lane (called in that thread)."""
        self._thread_id = threading.get_ident()

    def run(self, run: Run, func: Any, slot: int) -> Outcome:
        """Run the job of ``run``; return its outcome (never raises but ``PoolBroken``)."""
        job = run.job
        self.slots.mark(slot, RUNNING)
        self.inside = slot
        outcome = run_job(func, job, run)
        self.inside = -1
        if self.stopping:
            self._stopped()
        if outcome.kind == ACK and not settles_alone(func, job):
            # Should the process die before the ack commits, its sentinel acks it.
            self.slots.mark(slot, RETURNED)
        return outcome

    def stop(self, slot: int, exc: type[BaseException] = TimeLimitExceeded) -> bool:
        """Raise ``exc`` in the handler of ``slot``; False if it is not inside it.

        ``TimeLimitExceeded`` at a time limit or a lapsed claim, ``Cancelled``
        once a run asked to cancel has outlived its grace.

        Called from the worker's main thread. ``stopping`` is written before
        ``inside`` is read, and ``inside`` after the handler before
        ``stopping`` is read: either this sees the handler gone, or the
        handler's thread sees the stop and cancels a time-out raised too late
        to land inside it (``_stopped``, under the same lock).
        """
        self.stopping = True
        with self._lock:
            if self.inside != slot or not self._thread_id:
                return False
            return _raise_in(self._thread_id, exc) == 1

    def tell_cancel(self, slot: int) -> None:
        """Nothing to tell: the handler's thread reads the run the worker marked."""

    def _stopped(self) -> None:
        with self._lock:
            self.stopping = False
            _raise_in(self._thread_id, None)

    def interrupt(self) -> None:
        """Nothing can end a running thread; the process's exit will."""

    def end(self, deadline: float) -> None:
        """Return once what ``interrupt`` stopped has ended (nothing to wait for here)."""

    def close(self) -> None:
        """Nothing to release."""


class ProcessLane(ThreadLane):
    """Run handlers in one child process, replaced when it dies, hangs or grows too big."""

    def __init__(
        self,
        name: str,
        slots: ClaimSlots,
        *,
        max_jobs: int | None = None,
        max_memory_mb: float | None = None,
    ) -> None:
        super().__init__(slots)
        self.name = name
        self.max_jobs = max_jobs
        self.max_memory_mb = max_memory_mb
        self._child: Child | None = None
        self._interrupted: Child | None = None
        self._busy = threading.Event()
        # The claim slot whose job the child is running (None between jobs).
        self._running: int | None = None

    def start(self) -> None:
        """Start the child now, so the first job does not wait for Django to boot."""
        if self._child is None:
            self._child = Child(self.name)
            logger.info("child started name=%s pid=%d", self.name, self._child.pid)

    def run(self, run: Run, func: Any, slot: int) -> Outcome:
        """Run the job of ``run`` in the child; ``PoolBroken`` when no child can be started."""
        job = run.job
        try:
            self.start()
        except (ChildGone, OSError) as exc:
            # Not the job's failure: it never started. The worker gives it back and stops.
            raise PoolBroken(f"could not start a child process: {describe(exc)}") from exc
        child = self._child
        assert child is not None
        self.slots.mark(slot, RUNNING)
        self._busy.set()
        self._running = slot
        try:
            outcome = child.run(job, job.timeout_s, run)
        finally:
            self._running = None
            self._busy.clear()
        if child.process.poll() is not None:
            # Killed for its time limit, or dead: the next job gets a new child.
            logger.warning(
                "child replaced name=%s pid=%d job=%s error=%s",
                self.name,
                child.pid,
                job.id,
                outcome.error,
            )
            self._child = None
        elif outcome.kind == ACK and not settles_alone(func, job):
            self.slots.mark(slot, RETURNED)
        self._recycle_if_due()
        return outcome

    def _recycle_if_due(self) -> None:
        child = self._child
        if child is None:
            return
        reason = None
        if self.max_jobs is not None and child.jobs >= self.max_jobs:
            reason = f"jobs={child.jobs}"
        elif self.max_memory_mb is not None and child.rss_mb > self.max_memory_mb:
            reason = f"rss_mb={child.rss_mb:.0f}"
        if reason is not None:
            logger.info("child recycled name=%s pid=%d %s", self.name, child.pid, reason)
            child.stop()
            self._child = None

    def stop(self, slot: int, exc: type[BaseException] = TimeLimitExceeded) -> bool:
        """End the child running ``slot`` at once; False if it is not running that slot.

        Only a superseded claim's run, or a run asked to cancel past its
        grace, is stopped this way (the child keeps its own time limit): the
        first's outcome is void, and its job's new claim must not run beside
        it; the second ends cancelled whatever ``exc`` says. ``run`` sees the
        child die; the next job gets a new one.
        """
        child = self._child
        if child is None or self._running != slot:
            return False
        child.end_by(time.monotonic())
        return True

    def tell_cancel(self, slot: int) -> None:
        """Tell the child running ``slot`` that its run was asked to cancel (SIGUSR1).

        The child's own run is what its handler reads; the signal marks it.
        Safe to repeat, and a no-op once the child has moved on from ``slot``.
        """
        child = self._child
        if child is not None and self._running == slot:
            child.tell_cancel()

    def interrupt(self) -> None:
        """Kill the child if it is running a job (from another thread, at shutdown)."""
        child = self._child
        if child is not None and self._busy.is_set():
            self._interrupted = child
            child.terminate()  # run() sees it die and records how

    def end(self, deadline: float) -> None:
        """SIGKILL the interrupted child and its group if SIGTERM has not ended it by ``deadline``.

        Its job's attempt is recorded next: a child that ignores SIGTERM must
        not run beside that job's next attempt.
        """
        if self._interrupted is not None:
            self._interrupted.end_by(deadline)
            self._interrupted = None

    def close(self) -> None:
        """Let the child finish and exit."""
        if self._child is not None:
            self._child.stop()
            self._child = None


def make_lane(
    pool: str,
    name: str,
    slots: ClaimSlots,
    *,
    max_jobs: int | None = None,
    max_memory_mb: float | None = None,
) -> ThreadLane:
    """Return one lane of a ``pool`` (``threads`` or ``processes``)."""
    if pool == "processes":
        return ProcessLane(name, slots, max_jobs=max_jobs, max_memory_mb=max_memory_mb)
    return ThreadLane(slots)
