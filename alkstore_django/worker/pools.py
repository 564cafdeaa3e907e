"""Where a worker's handlers run: the lanes of its pool, each a thread that may drive a child.

A pool (``--pool threads`` or ``processes``) is ``--concurrency`` lanes: one
handler thread each, which takes held jobs one at a time (``Worker._serve``).
A lane is what that thread does with a job. ``ThreadLane`` calls the handler
right there. ``ProcessLane`` hands the job to the lane's child process
(``children.py``) and waits, which lets it enforce a hard time limit, survive
the child's death and recycle leaking children. Both mark the job's claim
slot (``slots.py``) so that the worker's sentinel knows what was running.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from ..error_text import describe
from ..executor import ACK, Outcome, has_hooks, run_job
from ..records import Job
from .children import Child, ChildGone
from .slots import RETURNED, RUNNING, ClaimSlots

logger = logging.getLogger("alkstore_django.worker")

POOLS = ("threads", "processes")


class PoolBroken(Exception):
    """A lane cannot run jobs at all (its child process does not start)."""


class ThreadLane:
    """Run handlers in the calling thread. A run cannot be stopped: Python cannot kill a thread."""

    def __init__(self, slots: ClaimSlots) -> None:
        self.slots = slots

    def start(self) -> None:
        """Nothing to start: the thread is the lane."""

    def run(self, job: Job, func: Any, slot: int) -> Outcome:
        """Run ``job``'s handler; return its outcome (never raises but ``PoolBroken``)."""
        self.slots.mark(slot, RUNNING)
        outcome = run_job(func, job)
        if outcome.kind == ACK and not has_hooks(func):
            # Should the process die before the ack commits, its sentinel acks it.
            self.slots.mark(slot, RETURNED)
        return outcome

    def interrupt(self) -> None:
        """Nothing can end a running thread; the process's exit will."""

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
        self._busy = threading.Event()

    def start(self) -> None:
        """Start the child now, so the first job does not wait for Django to boot."""
        if self._child is None:
            self._child = Child(self.name)
            logger.info("child started name=%s pid=%d", self.name, self._child.pid)

    def run(self, job: Job, func: Any, slot: int) -> Outcome:
        """Run ``job`` in the child; ``PoolBroken`` when no child can be started."""
        try:
            self.start()
        except (ChildGone, OSError) as exc:
            # Not the job's failure: it never started. The worker gives it back and stops.
            raise PoolBroken(f"could not start a child process: {describe(exc)}") from exc
        child = self._child
        assert child is not None
        self.slots.mark(slot, RUNNING)
        self._busy.set()
        try:
            outcome = child.run(job, job.timeout_s)
        finally:
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
        elif outcome.kind == ACK and not has_hooks(func):
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

    def interrupt(self) -> None:
        """Kill the child if it is running a job (from another thread, at shutdown)."""
        child = self._child
        if child is not None and self._busy.is_set():
            child.terminate()  # run() sees it die, and SIGKILLs it after the grace

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
