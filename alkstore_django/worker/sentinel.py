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
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import time
from typing import TYPE_CHECKING

from django.db import connections

from .. import presence
from ..executor import Outcome, OutcomeKind, Settled, settle
from ..models import Job
from ..queues import JobHandle
from .slots import CLAIMED, RETURNED

if TYPE_CHECKING:
    from .loop import Worker

logger = logging.getLogger("alkstore_django.worker")

DIED = "the worker process {worker_id!r} died while running this job (killed, crashed or exited)"
POLL_PARENT_S = 0.1


def start_sentinel(worker: Worker) -> int | None:
    """Fork the sentinel of ``worker``, which must not have started; return its pid.

    Returns None where processes cannot be forked (the claims then lapse as
    they always did). Call it before ``worker.run()``: the fork must happen
    before any thread or database connection exists.
    """
    if not hasattr(os, "fork"):
        return None
    connections.close_all()
    parent = os.getpid()
    pid = os.fork()
    if pid:
        logger.info("sentinel started pid=%d worker_id=%s", pid, worker.worker_id)
        return pid
    # The child. A Ctrl-C in the terminal, a SIGTERM to the process group or a
    # hang-up are meant for the worker: the sentinel ends by itself once the
    # worker has, after settling. SIGKILL of the whole group ends it too (the
    # claims then lapse).
    code = 0
    try:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)
        _wait_for_exit(parent)
        settle_held(worker)
        presence.leave(worker.store.using, worker.worker_id)
    except BaseException:
        logger.exception("sentinel of worker %s failed", worker.worker_id)
        code = 1
    finally:
        logging.shutdown()
        os._exit(code)


def _wait_for_exit(parent: int) -> None:
    """Return once process ``parent`` has exited."""
    pidfd = None
    with contextlib.suppress(AttributeError, OSError):
        pidfd = os.pidfd_open(parent)
    if pidfd is not None and os.getppid() == parent:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        poller.poll()
        os.close(pidfd)
        return
    # Without pidfd (or should the parent have gone already): the sentinel is
    # re-parented once its parent exits.
    while os.getppid() == parent:
        time.sleep(POLL_PARENT_S)


def settle_held(worker: Worker) -> dict[Settled, int]:
    """Settle every job ``worker``'s slots still hold; return counts by what happened.

    Each goes through ``executor.settle``, as the worker's own outcomes do:
    released, acked without hooks (a slot is marked returned only for a
    handler without any), or failed with ``DIED``.
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
    died = Outcome(OutcomeKind.RETRY, error=DIED.format(worker_id=worker.worker_id))
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
