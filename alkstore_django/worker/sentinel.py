"""The sentinel: a small child process that settles a dead worker's held jobs.

When a worker process dies without settling what it holds — a handler called
``os._exit()``, a segfault, the OOM killer, a SIGKILL — the database sees only
claims that will lapse, and cannot tell the job that was running from those
merely prefetched behind it. Charging them all would spend innocent jobs'
attempts (a job that kills its worker would take its neighbours to the dead
letters with it). The sentinel, forked before the worker opens any connection
or thread, shares the worker's ``ClaimSlots`` and waits for it to exit. It
then settles each job still held, by what the slots say it was:

- prefetched, never started: released, its attempt given back;
- running: a failed attempt ("the worker process died while running this
  job"), retried with backoff or dead-lettered when exhausted, through the
  same outcome path as any failure (the Tasks backend records it);
- returned, its ack not yet written: acked.

Every operation is fenced by the claim generation, so a job the worker did
settle before dying, or one already re-claimed, is left alone. If the
sentinel dies too (the whole process group SIGKILLed at once, the host lost),
the claims simply lapse and are recovered as before, each spending an attempt.

It is also the worker's watchdog: a worker whose loop has stopped moving
(``Pulse``) while it holds jobs is SIGKILLed and settled the same way: past a
third of their shortest visibility timeout when no thread of it runs either
(a handler holding the GIL), and only as its claims near lapsing when the
loop waits outside Python (a database lock that another session holds).
Once the worker stops on its own, ``runworker`` tells the sentinel
(``finish_sentinel``) and exits only after it has.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from django.db import DatabaseError, connections

from .. import presence
from ..error_text import timed_out
from ..executor import Outcome, OutcomeKind, Settled, settle
from ..models import Job, JobState
from ..queues.handles import JobHandle
from .holdings import HEARTBEAT_FRACTION
from .slots import CLAIMED, RETURNED, TIMED_OUT

if TYPE_CHECKING:
    from .loop import Worker

logger = logging.getLogger("alkstore_django.worker")

DIED = "the worker process {worker_id!r} died while running this job (killed, crashed or exited)"
# A running job's error when its worker was killed as stuck: "what it did" is the watchdog's.
STALLED = (
    "the worker process {worker_id!r} {what} while running this job and its sentinel killed it"
)
POLL_PARENT_S = 0.1
# How often the sentinel looks at the worker's pulse.
WATCH_S = 0.1
# The least a loop may stand still before the watchdog judges it: a claim or
# an upkeep chore may take that long on a busy database.
STALL_FLOOR_S = 1.0
# A claim is renewed every third of its visibility timeout, so it can lapse two
# thirds of it after the loop stopped: a loop waiting outside Python (a database
# lock) is killed a tenth of that sooner, before another worker could take its job.
WAIT_FRACTION = (1 - HEARTBEAT_FRACTION) * 0.9
# How long a stopping ``runworker`` waits for its sentinel to settle and exit.
SENTINEL_EXIT_S = 30.0


def start_sentinel(workers: Sequence[Worker]) -> int | None:
    """Fork the sentinel of ``workers``, none of which has started; return its pid.

    One sentinel for the process: a ``runworker`` serving queues on several
    aliases runs a Worker per alias (``crew.py``), and settles them all.
    Returns None where processes cannot be forked (the claims then lapse as
    they always did). Call it before ``run()``: the fork must happen before
    any thread or database connection exists. Once every ``run()`` has
    returned, ``finish_sentinel`` lets it settle and waits for it.
    """
    if not hasattr(os, "fork"):
        return None
    connections.close_all()
    parent = os.getpid()
    finish_pipes = [worker.pulse.open_finish() for worker in workers]
    pid = os.fork()
    if pid:
        logger.info("sentinel started pid=%d worker_id=%s", pid, workers[0].worker_id)
        for worker in workers:
            worker.pulse.start_ticking()
        return pid
    # The child. A Ctrl-C in the terminal, a SIGTERM to the process group or a
    # hang-up are meant for the worker: the sentinel ends by itself once the
    # worker has, after settling. SIGKILL of the whole group ends it too (the
    # claims then lapse).
    code = 0
    try:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)
        stalled = _watch(workers, parent, finish_pipes)
        for worker in workers:
            if stalled is not None and stalled[0] is worker:
                settle_held(worker, STALLED.format(worker_id=worker.worker_id, what=stalled[1]))
            else:
                settle_held(worker)
            presence.leave(worker.store.using, worker.worker_id)
    except BaseException:
        logger.exception("sentinel of worker %s failed", workers[0].worker_id)
        code = 1
    finally:
        logging.shutdown()
        os._exit(code)


def finish_sentinel(workers: Sequence[Worker], pid: int | None) -> None:
    """Tell the sentinel ``pid`` that ``workers`` have stopped; return once it has exited.

    The sentinel settles what the worker could not and leaves; a supervisor
    that signals the process group once the command has exited must not catch
    it mid-settle. Waits at most ``SENTINEL_EXIT_S``.
    """
    if pid is None:
        return
    for worker in workers:
        worker.pulse.finish()
    deadline = time.monotonic() + SENTINEL_EXIT_S
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == 0:
                time.sleep(POLL_PARENT_S / 10)
                continue
        return
    logger.warning("sentinel pid=%d still settling after %g s; exiting", pid, SENTINEL_EXIT_S)


def _watch(
    workers: Sequence[Worker], parent: int, finish_pipes: Sequence[int]
) -> tuple[Worker, str] | None:
    """Return once the worker process has exited or finished (None), or was killed as stuck.

    A worker whose loop stops beating (``Pulse``) while it holds jobs is
    SIGKILLed before its claims lapse: a handler holding the GIL stops its
    heartbeats, its time limits and its SIGTERM handler. Returns the stuck
    worker and the error its running jobs are charged with. ``finish_pipes`` are
    the pipes the workers' ``Pulse.finish`` writes to: the pulses are read at
    once when one is written.
    """
    pidfd = None
    with contextlib.suppress(AttributeError, OSError):
        pidfd = os.pidfd_open(parent)
    watchdogs = [Watchdog(worker) for worker in workers]
    try:
        while not _exited(parent, pidfd, WATCH_S, finish_pipes):
            pulses = [worker.pulse.read() for worker in workers]
            if all(finished for _, _, finished in pulses):
                return None
            for watchdog, (rounds, ticks, finished) in zip(watchdogs, pulses, strict=True):
                error = None if finished else watchdog.judge(rounds, ticks)
                if error is None:
                    continue
                logger.error(
                    "worker %s %s: its sentinel kills it and settles its jobs",
                    watchdog.worker.worker_id,
                    error,
                )
                with contextlib.suppress(ProcessLookupError):
                    os.kill(parent, signal.SIGKILL)
                while not _exited(parent, pidfd, None):
                    pass
                return watchdog.worker, error
        return None
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _exited(
    parent: int, pidfd: int | None, timeout_s: float | None, woken_by: Sequence[int] = ()
) -> bool:
    """Wait up to ``timeout_s`` (None: no limit) for ``parent`` to exit; True once it has.

    With a pidfd, a write to one of the pipes ``woken_by`` ends the wait early
    (False); without one the pipes are not watched, and the caller looks at the
    pulses after each ``timeout_s``.
    """
    if pidfd is not None:
        poller = select.poll()
        for fd in (pidfd, *woken_by):
            poller.register(fd, select.POLLIN)
        exited = False
        for fd, _ in poller.poll(None if timeout_s is None else timeout_s * 1000):
            if fd == pidfd:
                exited = True
            else:
                os.read(fd, 64)  # taken, so the next wait does not end at once
        return exited
    # Without pidfd: the sentinel is re-parented once its parent exits.
    waited = 0.0
    while os.getppid() == parent:
        if timeout_s is not None and waited >= timeout_s:
            return False
        time.sleep(POLL_PARENT_S)
        waited += POLL_PARENT_S
    return True


class Watchdog:
    """Judge, from the sentinel, whether the worker's loop has stopped moving.

    Only while jobs are held: the shortest visibility timeout among the held
    jobs the database still shows under this worker's claim sets the limits,
    read once per set of held jobs (not per poll) and only once the loop has
    stood still for ``STALL_FLOOR_S``. When no thread of the process runs
    either (the pulse's ticker stood still as long), the GIL is held: the
    loop is killed after a third of that timeout. When the ticker goes on,
    the loop waits outside Python, most likely on a database lock that will
    be let go: it is killed only as its claims come near lapsing.
    """

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self._rounds = self._ticks = -1
        self._since = self._ticked_at = self._polled_at = time.monotonic()
        self._held: list[tuple[int, int, int]] = []
        self._timeout_s: float | None = None

    def judge(self, rounds: int, ticks: int) -> str | None:
        """Return what the stuck loop did, once it has stood still past its limit."""
        now = time.monotonic()
        # A gap far longer than a poll means the sentinel was stopped too (the
        # whole process group, or the host, paused): the loop was not stalled
        # while both stood still, so its stall is timed from now.
        paused = now - self._polled_at > STALL_FLOOR_S
        self._polled_at = now
        if ticks != self._ticks or paused:
            self._ticks, self._ticked_at = ticks, now
        if rounds != self._rounds or paused:
            self._rounds, self._since = rounds, now
            return None
        still_s = now - self._since
        if still_s < STALL_FLOOR_S:
            return None
        held = self.worker.holdings.slots.held()
        if held != self._held:
            self._held, self._timeout_s = held, self._timeout_for(held)
        if self._timeout_s is None:
            return None
        gil_still_s = min(still_s, now - self._ticked_at)
        if gil_still_s > max(self._timeout_s * HEARTBEAT_FRACTION, STALL_FLOOR_S):
            return f"made no progress for {still_s:.1f} s (a handler holding the GIL?)"
        if still_s > max(self._timeout_s * WAIT_FRACTION, STALL_FLOOR_S):
            return (
                f"made no progress for {still_s:.1f} s, waiting outside Python (on the "
                "database?) until its claims were near lapsing"
            )
        return None

    def _timeout_for(self, held: list[tuple[int, int, int]]) -> float | None:
        if not held:
            return None
        using = self.worker.store.using
        fences = {job_id: generation for job_id, generation, _ in held}
        try:
            rows = Job.objects.using(using).filter(
                id__in=fences, worker_id=self.worker.worker_id, state=JobState.PROCESSING
            )
            timeouts = [
                vt
                for job_id, generation, vt in rows.values_list(
                    "id", "generation", "visibility_timeout_s"
                )
                if fences[job_id] == generation
            ]
        except DatabaseError:
            logger.warning("sentinel cannot read the held jobs; judging later", exc_info=True)
            timeouts = []
        finally:
            # The wait before the next read may outlast the server's idle timeout.
            connections.close_all()
        return min(timeouts, default=None)


def settle_held(worker: Worker, error: str | None = None) -> dict[Settled, int]:
    """Settle every job ``worker``'s slots still hold; return counts by what happened.

    Each goes through ``executor.settle``, as the worker's own outcomes do:
    released, acked without hooks (a slot is marked returned only for a
    handler without any), or failed with ``error`` (``DIED`` by default).
    """
    held = worker.holdings.slots.held()
    counts: dict[Settled, int] = {}
    if not held:
        return counts
    by_id = {
        job.id: job
        for job in Job.objects.using(worker.store.using).filter(
            id__in=[job_id for job_id, _, _ in held], worker_id=worker.worker_id
        )
    }
    queues = {q.name: q for q in worker.build_queues()}
    died = Outcome(OutcomeKind.RETRY, error=error or DIED.format(worker_id=worker.worker_id))
    using = worker.store.using
    for job_id, generation, state in held:
        row = by_id.get(job_id)
        queue = queues.get(row.queue) if row is not None else None
        if row is None or queue is None or row.generation != generation:
            continue  # settled before the worker died, or claimed by another since
        handle = JobHandle(queue, row.to_record())
        if state == CLAIMED:
            result = settle(handle, Outcome(OutcomeKind.RELEASE), None, using)
        elif state == RETURNED:
            result = settle(handle, Outcome(OutcomeKind.ACK), None, using)
        elif row.cancel_requested_at is not None:
            # Asked to cancel while it ran: it ends cancelled however the worker died.
            cancel = Outcome(OutcomeKind.CANCEL, error=f"cancelled: {died.error}")
            result = settle(handle, cancel, worker.handlers.get(row.queue), using)
        elif state == TIMED_OUT and row.timeout_s is not None:
            # A thread that did not stop at its limit: its run ended with the process.
            limit = Outcome(OutcomeKind.RETRY, error=timed_out(row.timeout_s))
            result = settle(handle, limit, worker.handlers.get(row.queue), using)
        else:
            result = settle(handle, died, worker.handlers.get(row.queue), using)
        counts[result] = counts.get(result, 0) + 1
        logger.warning(
            "job id=%s queue=%s outcome=%s attempts=%s settled by the sentinel of %s",
            job_id,
            row.queue,
            result,
            row.attempts,
            worker.worker_id,
        )
    connections.close_all()
    return counts
