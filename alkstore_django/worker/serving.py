"""What every pool does around a run: the checks before it starts and the hand-back after.

A pool (``threads.py``, ``aio.py``) takes the held jobs the loop claimed and
runs them in its lanes; whatever runs them, a job whose claim was superseded
or whose queue was paused since is given back unstarted, one asked to cancel
before it started is cancelled without running, and every outcome goes to
the completer, waking the loop when it has a batch to settle or nothing left
to run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..executor import Outcome, OutcomeKind
from .cancels import NOT_STARTED
from .holdings import Done, Held

if TYPE_CHECKING:
    from .loop import Worker

# The name every handler thread's name starts with.
JOB_THREAD = "alkstore-job"


class Pool:
    """The lanes a worker's handlers run in, fed the jobs its loop holds.

    ``lanes`` are what the loop asks to stop a run (``stop(slot, exc)``,
    ``tell_cancel``), to interrupt what runs at shutdown (``interrupt``,
    ``end``) and to close.
    """

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.lanes: list[Any] = []
        # Read at each job: ``Controls.paused`` is replaced, never mutated.
        self._controls = worker.controls
        self._done = worker.completer.done
        self._wake = worker.wake
        self._refill_at = worker.refill_at

    def start(self) -> None:
        """Start the lanes (called once, before the first claim)."""
        raise NotImplementedError

    def submit(self, held: list[Held]) -> None:
        """Queue newly held jobs for the lanes, in claim order."""
        raise NotImplementedError

    def unstarted(self) -> list[Held]:
        """Take every queued job no lane has picked up yet (at shutdown)."""
        raise NotImplementedError

    def close(self) -> None:
        """Tell the lanes to end once idle, and wait a little for them."""
        raise NotImplementedError

    def running(self) -> int:
        """Return how many runs are still going (after the worker stopped)."""
        raise NotImplementedError

    def not_to_run(self, held: Held) -> Outcome | None:
        """Return the outcome of a job that must not start now, or None to run it."""
        if held.superseded or held.handle.job.queue in self._controls.paused:
            # Not started: the claim's attempt goes back with the job (a
            # superseded claim's release is refused without a statement).
            return Outcome(OutcomeKind.RELEASE)
        if held.run.cancel_requested or held.handle.job.cancel_requested_at is not None:
            # Asked to cancel before it started (an earlier claim lapsed mid-cancel).
            return Outcome(OutcomeKind.CANCEL, error=NOT_STARTED)
        return None

    def hand_back(self, held: Held, outcome: Outcome, idle: bool) -> None:
        """Give ``held``'s outcome to the completer.

        The loop is woken when it has a batch to settle and claim, or when
        the lane is about to go ``idle``; not once per job.
        """
        self._done.put(Done(held, outcome))
        if idle or self._done.qsize() >= self._refill_at:
            self._wake.set()
