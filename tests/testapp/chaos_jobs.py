"""Handlers of the chaos suite; each run is recorded in ``ChaosRun`` keyed by (job id, attempt).

The run is committed before the handler returns, so a process killed after
the record and before the ack leaves evidence of the interrupted run: the
re-run then shows up as a second attempt of the same job.
"""

from __future__ import annotations

import os
import signal
import time

from django.db import IntegrityError, transaction
from django.db.models import F

from alkstore_django import Fail, handler

from .models import ChaosRun

SLICE_S = 0.05


def record(job) -> None:
    """Record this run; a second run of the same attempt is counted, never hidden."""
    try:
        with transaction.atomic():
            ChaosRun.objects.create(
                job_id=job.id,
                attempt=job.attempts,
                queue=job.queue,
                worker_id=job.worker_id or "",
                pid=os.getpid(),
            )
    except IntegrityError:
        ChaosRun.objects.filter(job_id=job.id, attempt=job.attempts).update(
            duplicates=F("duplicates") + 1
        )


def work(seconds: float) -> None:
    """Spend ``seconds`` of the process's own running time, in slices.

    A process stopped with SIGSTOP makes no progress here, so after SIGCONT
    the handler still has work left and the worker's heartbeat and outcome
    race against nothing but the test's own steps.
    """
    for _ in range(round(seconds / SLICE_S)):
        time.sleep(SLICE_S)


def _options(job) -> dict:
    return job.payload if isinstance(job.payload, dict) else {}


@handler("chaos.work")
def chaos_work(job):
    record(job)
    if _options(job).get("exit"):
        os._exit(3)  # a poison job among ordinary ones on the same queue
    time.sleep(float(_options(job).get("work_ms", 0)) / 1000)
    return job.id


@handler("chaos.tick")
def chaos_tick(job):
    """The target of the chaos schedules: recorded like any other job."""
    return chaos_work(job)


@handler("chaos.poison")
def chaos_poison(job):
    """Kill the worker process that runs it, as a segfaulting extension would."""
    record(job)
    os._exit(3)


@handler("chaos.stale")
def chaos_stale(job):
    """Record, work, then ack, retry or fail as the payload says."""
    record(job)
    options = _options(job)
    work(float(options.get("work_s", 1.0)))
    outcome = options.get("outcome", "ack")
    if outcome == "retry":
        raise RuntimeError("stale worker asks for a retry")
    if outcome == "fail":
        raise Fail("stale worker asks to fail")
    return job.id


@handler("chaos.fork")
def chaos_fork(job):
    """At its first attempt, fork a helper that outlives the process, then die of SIGKILL.

    The helper's pid goes to ``<pid_dir>/<job id>``; later attempts work and ack.
    """
    record(job)
    options = _options(job)
    if options.get("pid_dir") and job.attempts == 1:
        helper = os.fork()
        if helper == 0:
            time.sleep(120)
            os._exit(0)
        with open(os.path.join(options["pid_dir"], str(job.id)), "w") as pid_file:
            pid_file.write(str(helper))
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(float(options.get("work_ms", 0)) / 1000)
    return job.id
